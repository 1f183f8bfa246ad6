//! One test per kernel group (`cases::GROUPS`): every output of the group
//! within its tolerance of the CPU backend.

use crate::cases::{self, Ctx, DEFAULT_SEED, GROUPS, Group};
use crate::device::with_gpu;

/// Runs one group on its own backend; fails listing every output out of
/// tolerance (the full table is printed, shown by the harness on failure).
fn check_group(group: Group) {
    with_gpu(|gpu| {
        let mut ctx = Ctx::new(gpu, DEFAULT_SEED);
        ctx.run_group(group);
        assert!(!ctx.outcomes.is_empty(), "the group compared nothing");
        let failed: Vec<String> = ctx
            .outcomes
            .iter()
            .filter(|o| !o.pass)
            .map(|o| o.line())
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} outputs out of tolerance:\n{}",
            failed.len(),
            ctx.outcomes.len(),
            failed.join("\n")
        );
    });
}

macro_rules! group_tests {
    ($($group:ident),* $(,)?) => {
        $(
            #[test]
            fn $group() {
                check_group(cases::$group);
            }
        )*

        /// The groups given a test above.
        const TESTED: &[&str] = &[$(stringify!($group)),*];
    };
}

group_tests!(
    embedding,
    elementwise,
    norms,
    norm_matmul,
    norm_moe,
    matmul,
    attention,
    block_attention,
    block_attention_batch,
    moe,
    gated_delta_net,
    argmax_rows,
    top_candidates,
    top_candidates_draw,
    mask_rows,
    precision_f32,
    fp8,
    flash_next,
);

#[test]
fn every_group_the_example_runs_has_a_test() {
    let names: Vec<&str> = GROUPS.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, TESTED);
}
