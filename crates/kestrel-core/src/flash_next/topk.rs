//! Which blocks a top-k keeps when scores tie, as PyTorch's CPU `topk` does.
//!
//! The indexer's scores are sums of ReLUs, so exact ties (most often at 0)
//! are common, and the reference's choice among tied blocks is whatever its
//! selection algorithm leaves in the first k places: PyTorch's CPU kernel
//! runs the C++ standard library's `nth_element` (or `partial_sort` when
//! `64 k <= n`) over (score, index) pairs ordered by score alone, larger
//! first. These are the GNU implementations of the two algorithms
//! (introselect with median-of-three pivots and a final insertion sort; a
//! binary-heap selection), so that the same set comes out.

type Item = (f32, usize);

/// `a` goes before `b`: the larger score (NaN first), never by index.
fn before(a: &Item, b: &Item) -> bool {
    (a.0.is_nan() && !b.0.is_nan()) || a.0 > b.0
}

/// Indices of the `k` best scores, as the set PyTorch's CPU topk returns.
pub fn top_k_set(scores: &[f32], k: usize) -> Vec<usize> {
    let n = scores.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let mut q: Vec<Item> = scores.iter().copied().zip(0..).collect();
    if k * 64 <= n {
        heap_select(&mut q, 0, k, n);
    } else {
        nth_element(&mut q, k - 1);
    }
    q[..k].iter().map(|x| x.1).collect()
}

/// [`top_k_set`] in ascending index order, cheaply where ties cannot
/// matter: when the blocks tied with the `k`-th best score all fit in the
/// `k` kept, every algorithm keeps the same set (the scores at or above it),
/// found with one selection over the values; otherwise (and with NaNs) the
/// reference's algorithm decides.
pub fn top_k_sorted(scores: &[f32], k: usize) -> Vec<u32> {
    let n = scores.len();
    let k = k.min(n);
    if k == n {
        return (0..n as u32).collect();
    }
    if k > 0 && !scores.iter().any(|s| s.is_nan()) {
        let mut values = scores.to_vec();
        let (_, &mut kth, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        // -0.0 and 0.0 tie in the reference's order (`>`), not in total_cmp's.
        let above = scores.iter().filter(|&&s| s > kth).count();
        let tied = scores.iter().filter(|&&s| s == kth).count();
        if above + tied == k {
            return (0..n as u32)
                .filter(|&i| scores[i as usize] >= kth)
                .collect();
        }
    }
    let mut set: Vec<u32> = top_k_set(scores, k).into_iter().map(|i| i as u32).collect();
    set.sort_unstable();
    set
}

fn floor_log2(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn nth_element(q: &mut [Item], nth: usize) {
    let (mut first, mut last) = (0, q.len());
    if nth >= last {
        return;
    }
    let mut depth = 2 * floor_log2(last);
    while last - first > 3 {
        if depth == 0 {
            heap_select(q, first, nth + 1, last);
            q.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(q, first, last);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(q, first, last);
}

fn partition_pivot(q: &mut [Item], first: usize, last: usize) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(q, first, first + 1, mid, last - 1);
    unguarded_partition(q, first + 1, last, first)
}

fn move_median_to_first(q: &mut [Item], result: usize, a: usize, b: usize, c: usize) {
    let pick = if before(&q[a], &q[b]) {
        if before(&q[b], &q[c]) {
            b
        } else if before(&q[a], &q[c]) {
            c
        } else {
            a
        }
    } else if before(&q[a], &q[c]) {
        a
    } else if before(&q[b], &q[c]) {
        c
    } else {
        b
    };
    q.swap(result, pick);
}

fn unguarded_partition(q: &mut [Item], mut first: usize, mut last: usize, pivot: usize) -> usize {
    loop {
        while before(&q[first], &q[pivot]) {
            first += 1;
        }
        last -= 1;
        while before(&q[pivot], &q[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        q.swap(first, last);
        first += 1;
    }
}

fn insertion_sort(q: &mut [Item], first: usize, last: usize) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        let v = q[i];
        if before(&v, &q[first]) {
            q.copy_within(first..i, first + 1);
            q[first] = v;
        } else {
            let mut j = i;
            while before(&v, &q[j - 1]) {
                q[j] = q[j - 1];
                j -= 1;
            }
            q[j] = v;
        }
    }
}

/// Leaves in `[first, middle)` the `middle - first` best of `[first, last)`.
fn heap_select(q: &mut [Item], first: usize, middle: usize, last: usize) {
    make_heap(q, first, middle);
    for i in middle..last {
        if before(&q[i], &q[first]) {
            let v = q[i];
            q[i] = q[first];
            adjust_heap(q, first, 0, middle - first, v);
        }
    }
}

fn make_heap(q: &mut [Item], first: usize, last: usize) {
    let len = last - first;
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let v = q[first + parent];
        adjust_heap(q, first, parent, len, v);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

fn adjust_heap(q: &mut [Item], base: usize, mut hole: usize, len: usize, v: Item) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if before(&q[base + child], &q[base + child - 1]) {
            child -= 1;
        }
        q[base + hole] = q[base + child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        q[base + hole] = q[base + child - 1];
        hole = child - 1;
    }
    // Push `v` up from the hole.
    while hole > top {
        let parent = (hole - 1) / 2;
        if !before(&q[base + parent], &v) {
            break;
        }
        q[base + hole] = q[base + parent];
        hole = parent;
    }
    q[base + hole] = v;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<usize>) -> Vec<usize> {
        v.sort_unstable();
        v
    }

    #[test]
    fn ties_resolve_as_the_reference_kernel_resolves_them() {
        // Two selections recorded from transformers' indexer: 5 blocks, 4 kept,
        // two of them tied at zero. Which of the tied blocks stays differs.
        let a = [3.1343358, 0.0, 3.3808296, 0.0, 2.0877497];
        assert_eq!(sorted(top_k_set(&a, 4)), vec![0, 2, 3, 4]);
        let b = [0.0, 1.25133, 1.4728547, 0.0, 1.8469632];
        assert_eq!(sorted(top_k_set(&b, 4)), vec![0, 1, 2, 4]);
    }

    #[test]
    fn the_sorted_form_keeps_the_reference_set_with_and_without_ties() {
        // Scores drawn from a few values so that ties straddle the k-th
        // place often; also signed zeros, all-equal rows and NaNs.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut straddled = 0;
        for case in 0..2000 {
            let n = 1 + (next() % 300) as usize;
            let levels = 1 + (next() % 40);
            let mut scores: Vec<f32> = (0..n)
                .map(|_| match next() % levels {
                    0 => 0.0,
                    1 => -0.0,
                    v => v as f32 * 0.25,
                })
                .collect();
            if case % 97 == 0 {
                scores[n / 2] = f32::NAN;
            }
            for k in [1, n / 4, n / 2, n - 1, n] {
                let want: Vec<u32> = sorted(top_k_set(&scores, k))
                    .into_iter()
                    .map(|i| i as u32)
                    .collect();
                let kept = want.len();
                assert_eq!(top_k_sorted(&scores, k), want, "case {case} k {k}");
                let kth = want
                    .iter()
                    .map(|&i| scores[i as usize])
                    .fold(f32::MAX, f32::min);
                if kept > 0 && scores.iter().filter(|&&s| s >= kth).count() > kept {
                    straddled += 1;
                }
            }
        }
        assert!(
            straddled > 100,
            "the ties straddle the k-th place in {straddled} cases only"
        );
    }

    #[test]
    fn without_ties_it_is_the_k_largest() {
        let scores: Vec<f32> = (0..300).map(|i| ((i * 7919) % 300) as f32).collect();
        for k in [1, 4, 5, 100, 300] {
            let mut want: Vec<usize> = (0..300).collect();
            want.sort_by(|&x, &y| scores[y].total_cmp(&scores[x]));
            assert_eq!(
                sorted(top_k_set(&scores, k)),
                sorted(want[..k].to_vec()),
                "k {k}"
            );
        }
    }
}
