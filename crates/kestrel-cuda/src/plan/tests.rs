use super::*;

fn device(cc: (i32, i32)) -> Device {
    let hopper = cc == (9, 0);
    Device {
        compute_capability: cc,
        sms: 132,
        attn_prefill_wgmma: [hopper; 3],
        attn_prefill_v2: [true, true, hopper],
        attn_decode_fused: [true, true, false],
    }
}

#[test]
fn hopper_defaults_take_wgmma_everywhere_it_exists() {
    let p = Plan::resolve(&device((9, 0)), &Overrides::default());
    assert_eq!(
        p.attention.prefill,
        PerHeadDim::from_fn(|_| AttnPrefill::Wgmma)
    );
    assert_eq!(p.attention.decode.get(2), AttnDecode::Unfused);
    assert_eq!(p.attention.decode.get(1), AttnDecode::Fused);
    assert_eq!(p.moe.expert_gemm, Mma::Wgmma);
    assert_eq!(p.moe.prefill, MoePrefill::DeviceRouted);
    assert_eq!(
        (p.gdn.chunk_math, p.gdn.state_pass),
        (ChunkMath::Tf32, Mma::Wgmma)
    );
    assert_eq!(p.dense_gemm, DenseGemm::CublasLtRowInvariant);
    assert!(p.graphs && p.norm_fusion && p.split_mixed_steps && p.invariant_prompts);
}

#[test]
fn prompt_rows_are_invariant_unless_by_size_batch_invariant_or_f32() {
    let by_size = Overrides {
        invariant_prompts: false,
        ..Overrides::default()
    };
    let p = Plan::resolve(&device((9, 0)), &by_size);
    assert!(!p.invariant_prompts);
    assert_eq!(p.dense_gemm, DenseGemm::CublasGemmEx);
    for o in [
        Overrides {
            batch_invariant: true,
            ..Overrides::default()
        },
        Overrides {
            precision: Precision::F32,
            ..Overrides::default()
        },
    ] {
        let p = Plan::resolve(&device((9, 0)), &o);
        assert!(!p.invariant_prompts, "{o:?}");
        assert_eq!(p.dense_gemm, DenseGemm::CublasGemmEx, "{o:?}");
    }
}

#[test]
fn mixed_steps_are_split_unless_asked_not_to_or_batch_invariant() {
    let one = Overrides {
        split_mixed_steps: false,
        ..Overrides::default()
    };
    assert!(!Plan::resolve(&device((9, 0)), &one).split_mixed_steps);
    let bi = Overrides {
        batch_invariant: true,
        ..Overrides::default()
    };
    assert!(!Plan::resolve(&device((9, 0)), &bi).split_mixed_steps);
}

#[test]
fn decode_splits_follow_the_step_unless_asked_for_one_sequences() {
    let p = Plan::resolve(&device((9, 0)), &Overrides::default());
    assert_eq!(p.decode_splits, DecodeSplits::Step);
    let one = Overrides {
        decode_splits_one_sequence: true,
        ..Overrides::default()
    };
    let p = Plan::resolve(&device((9, 0)), &one);
    assert_eq!(p.decode_splits, DecodeSplits::OneSequence);
    assert!(p.to_string().contains("decode splits one-sequence"), "{p}");
}

#[test]
fn other_gpus_fall_back_to_mma_sync_and_version_one_where_tiles_do_not_fit() {
    let p = Plan::resolve(&device((12, 1)), &Overrides::default());
    assert_eq!(p.attention.prefill.get(0), AttnPrefill::V2);
    assert_eq!(p.attention.prefill.get(2), AttnPrefill::V1);
    assert_eq!(
        (p.moe.expert_gemm, p.gdn.state_pass),
        (Mma::MmaSync, Mma::MmaSync)
    );
}

#[test]
fn the_reference_precision_takes_3xtf32_on_mma_sync_and_moe_in_decode_chunks() {
    let o = Overrides {
        precision: Precision::F32,
        ..Overrides::default()
    };
    let p = Plan::resolve(&device((9, 0)), &o);
    assert_eq!(
        (p.gdn.chunk_math, p.gdn.state_pass),
        (ChunkMath::Tf32x3, Mma::MmaSync)
    );
    assert_eq!(p.moe.prefill, MoePrefill::DecodeChunks);
}

#[test]
fn overrides_pick_the_older_kernels() {
    let o = Overrides {
        attn_prefill: AttnPrefillChoice::V2,
        attn_decode_fused: false,
        moe_gemm_wgmma: false,
        gdn_state_wgmma: false,
        ..Overrides::default()
    };
    let p = Plan::resolve(&device((9, 0)), &o);
    assert_eq!(
        p.attention.prefill,
        PerHeadDim::from_fn(|_| AttnPrefill::V2)
    );
    assert_eq!(
        p.attention.decode,
        PerHeadDim::from_fn(|_| AttnDecode::Unfused)
    );
    assert_eq!(
        (p.moe.expert_gemm, p.gdn.state_pass),
        (Mma::MmaSync, Mma::MmaSync)
    );
    let v1 = Overrides {
        attn_prefill: AttnPrefillChoice::V1,
        ..Overrides::default()
    };
    let p = Plan::resolve(&device((9, 0)), &v1);
    assert_eq!(
        p.attention.prefill,
        PerHeadDim::from_fn(|_| AttnPrefill::V1)
    );
}

#[test]
fn the_plan_prints_and_serialises() {
    let p = Plan::resolve(&device((9, 0)), &Overrides::default());
    let text = p.to_string();
    assert!(
        text.contains("attention: prefill wgmma; decode d64 fused, d128 fused, d256 unfused"),
        "{text}"
    );
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["attention"]["prefill"]["d128"], "wgmma");
    assert_eq!(json["moe"]["prefill"], "device-routed");
    assert_eq!(json["precision"], "bf16");
}
