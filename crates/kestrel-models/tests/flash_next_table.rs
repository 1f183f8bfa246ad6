//! The PLE n-gram table is served from the memory-mapped checkpoint: a
//! multi-gigabyte table (a sparse file here, so the test costs no disk)
//! yields the rows asked for while only their pages become resident.

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use kestrel_models::WeightFiles;
use kestrel_models::flash_next::ngram::NgramTable;

const ROWS: usize = 1 << 23;
const DIM: usize = 160;
const NAME: &str = "layers.0.ple.ple_embedding.ngram_embedding.weight";

/// Resident set size of this process, from /proc (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `dir/model.safetensors` holding the table as a hole of its full size:
/// the open file and where its data starts.
fn sparse_table(dir: &std::path::Path) -> (std::fs::File, u64) {
    let data_len = ROWS * DIM * 2;
    let mut header = format!(
        "{{\"{NAME}\":{{\"dtype\":\"BF16\",\"shape\":[{ROWS},{DIM}],\"data_offsets\":[0,{data_len}]}}}}"
    );
    while !(header.len() + 8).is_multiple_of(8) {
        header.push(' ');
    }
    let mut f = std::fs::File::create(dir.join("model.safetensors")).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let data_start = 8 + header.len() as u64;
    f.set_len(data_start + data_len as u64).unwrap();
    (f, data_start)
}

/// The table of the folder's file read as `rows` rows of `DIM` in `parts`
/// parts.
fn open_table(dir: &std::path::Path, rows: usize, parts: usize) -> anyhow::Result<NgramTable> {
    NgramTable::open(
        Arc::new(WeightFiles::open(dir).unwrap()),
        "layers.0.ple.ple_embedding.ngram_embedding.",
        rows,
        DIM,
        parts,
    )
}

fn row_value(row: usize, col: usize) -> f32 {
    (row % 1000) as f32 + col as f32 / 256.0
}

#[test]
fn a_mapped_multi_gigabyte_table_serves_rows_without_loading_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data_len = ROWS * DIM * 2;
    let (mut f, data_start) = sparse_table(dir.path());
    // A few rows written where they belong.
    let rows = [0usize, 17, 4_000_000, ROWS - 1];
    for &r in &rows {
        let bytes: Vec<u8> = (0..DIM)
            .flat_map(|c| half::bf16::from_f32(row_value(r, c)).to_le_bytes())
            .collect();
        f.seek(SeekFrom::Start(data_start + (r * DIM * 2) as u64))
            .unwrap();
        f.write_all(&bytes).unwrap();
    }
    drop(f);
    assert!(data_len > 2 << 30, "the table is multi-gigabyte");

    let before = resident_bytes();
    let table = open_table(dir.path(), ROWS, 4).unwrap();
    let wanted: Vec<u64> = rows.iter().rev().map(|&r| r as u64).collect();
    let got = table.gather(&wanted).unwrap();
    for (i, &r) in wanted.iter().enumerate() {
        for c in 0..DIM {
            let want = half::bf16::from_f32(row_value(r as usize, c)).to_f32();
            assert_eq!(got[i * DIM + c], want, "row {r} col {c}");
        }
    }
    // An untouched row of the hole reads as zeros.
    assert!(table.gather(&[123_456]).unwrap().iter().all(|&v| v == 0.0));
    let after = resident_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        let grown = a.saturating_sub(b);
        eprintln!(
            "resident memory grew by {} KiB for a {} MiB table",
            grown / 1024,
            data_len >> 20
        );
        assert!(
            grown < 64 << 20,
            "reading 5 rows made {grown} bytes resident"
        );
    }
    assert!(
        open_table(dir.path(), ROWS + 4, 4).is_err(),
        "a table of another size is refused"
    );
}

/// Rows read at random make one or two pages resident each, not the window
/// that read-ahead and fault-around would map around every fault (64 KiB by
/// default on Linux): the table's mapping is advised as random.
#[test]
fn random_rows_make_about_their_own_pages_resident() {
    let dir = tempfile::tempdir().unwrap();
    drop(sparse_table(dir.path()));
    let table = open_table(dir.path(), ROWS, 1).unwrap();
    // Rows far apart (a multiplicative hash), one at a time as tokens come.
    let n = 2000u64;
    let before = resident_bytes();
    for i in 0..n {
        let row = (i * 2_654_435_761) % ROWS as u64;
        assert!(table.gather(&[row]).unwrap().iter().all(|&v| v == 0.0));
    }
    if let (Some(b), Some(a)) = (before, resident_bytes()) {
        let per_row = a.saturating_sub(b) / n;
        eprintln!("{per_row} resident bytes per random row");
        assert!(
            per_row <= 3 * 4096,
            "{per_row} bytes resident per row read: the mapping reads around each row"
        );
    }
}
