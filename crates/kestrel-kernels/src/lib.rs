//! CUDA kernels for the kestrel CUDA backend, compiled ahead of time.
//!
//! Each `kernels/<name>.cu` becomes one fatbin (sm_90a and sm_121 machine
//! code plus compute_90 PTX) embedded as the byte slice `<NAME>`. Load one with
//! the driver's module loader (`cuModuleLoadData`). When the build found no
//! nvcc every slice is empty and [`available`] says why.

pub mod abi;

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// `Ok` when the kernels were compiled into this build.
pub fn available() -> Result<(), &'static str> {
    match UNAVAILABLE {
        None => Ok(()),
        Some(why) => Err(why),
    }
}

/// Every embedded module, by name (the `.cu` file stem).
pub fn modules() -> [(&'static str, &'static [u8]); 18] {
    [
        ("dummy", DUMMY),
        ("elementwise", ELEMENTWISE),
        ("norm", NORM),
        ("attention", ATTENTION),
        ("attention_decode", ATTENTION_DECODE),
        ("attention_block", ATTENTION_BLOCK),
        ("attention_prefill", ATTENTION_PREFILL),
        ("attention_prefill_sm90", ATTENTION_PREFILL_SM90),
        ("moe", MOE),
        ("moe_prefill", MOE_PREFILL),
        ("moe_gemm_sm90", MOE_GEMM_SM90),
        ("gdn", GDN),
        ("gdn_decode", GDN_DECODE),
        ("gdn_chunk", GDN_CHUNK),
        ("gemv", GEMV),
        ("fp8", FP8),
        ("sample", SAMPLE),
        ("flash_next", FLASH_NEXT),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_all_present_or_all_absent() {
        let sizes: Vec<usize> = modules().iter().map(|(_, b)| b.len()).collect();
        match available() {
            Ok(()) => assert!(sizes.iter().all(|&n| n > 0), "empty fatbin: {sizes:?}"),
            Err(why) => {
                assert!(!why.is_empty());
                assert!(sizes.iter().all(|&n| n == 0));
            }
        }
    }

    #[test]
    fn built_modules_are_fatbins() {
        if available().is_err() {
            return;
        }
        // Fatbin wrapper magic (little-endian 0xBA55ED50).
        for (name, bytes) in modules() {
            assert_eq!(&bytes[..4], &[0x50, 0xED, 0x55, 0xBA], "{name}");
        }
    }
}
