//! Range checks of `SamplingParams::validate`.

use kestrel_sampling::{Sampler, SamplingParams};

fn rejected(params: SamplingParams) -> &'static str {
    params.validate().expect_err("should be rejected").param
}

#[test]
fn defaults_and_edges_are_valid() {
    assert!(SamplingParams::default().validate().is_ok());
    let edges = [
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: 2.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 1e-6,
            ..Default::default()
        },
        SamplingParams {
            top_k: -1,
            ..Default::default()
        },
        SamplingParams {
            top_k: 1,
            ..Default::default()
        },
        SamplingParams {
            min_p: 1.0,
            ..Default::default()
        },
        SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1e-3,
            ..Default::default()
        },
        SamplingParams {
            max_tokens: Some(1),
            min_tokens: 1,
            ..Default::default()
        },
    ];
    for p in edges {
        assert!(p.validate().is_ok(), "{p:?}");
    }
}

#[test]
fn out_of_range_values_name_their_parameter() {
    let d = SamplingParams::default;
    assert_eq!(
        rejected(SamplingParams {
            temperature: -0.1,
            ..d()
        }),
        "temperature"
    );
    assert_eq!(
        rejected(SamplingParams {
            temperature: 2.01,
            ..d()
        }),
        "temperature"
    );
    assert_eq!(rejected(SamplingParams { top_p: 0.0, ..d() }), "top_p");
    assert_eq!(rejected(SamplingParams { top_p: 1.5, ..d() }), "top_p");
    assert_eq!(rejected(SamplingParams { top_k: -2, ..d() }), "top_k");
    assert_eq!(rejected(SamplingParams { min_p: -0.1, ..d() }), "min_p");
    assert_eq!(rejected(SamplingParams { min_p: 1.1, ..d() }), "min_p");
    assert_eq!(
        rejected(SamplingParams {
            presence_penalty: 2.5,
            ..d()
        }),
        "presence_penalty"
    );
    assert_eq!(
        rejected(SamplingParams {
            frequency_penalty: -2.5,
            ..d()
        }),
        "frequency_penalty"
    );
    assert_eq!(
        rejected(SamplingParams {
            repetition_penalty: 0.0,
            ..d()
        }),
        "repetition_penalty"
    );
    assert_eq!(
        rejected(SamplingParams {
            repetition_penalty: -1.0,
            ..d()
        }),
        "repetition_penalty"
    );
    assert_eq!(
        rejected(SamplingParams {
            prompt_logprobs: Some(21),
            ..d()
        }),
        "prompt_logprobs"
    );
    assert!(
        SamplingParams {
            max_tokens: Some(0),
            prompt_logprobs: Some(20),
            ..d()
        }
        .validate()
        .is_ok(),
        "max_tokens 0 computes the prompt alone"
    );
    assert_eq!(
        rejected(SamplingParams {
            max_tokens: Some(4),
            min_tokens: 5,
            ..d()
        }),
        "min_tokens"
    );
}

#[test]
fn nan_and_infinity_are_rejected_everywhere() {
    let d = SamplingParams::default;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(
            rejected(SamplingParams {
                temperature: bad,
                ..d()
            }),
            "temperature"
        );
        assert_eq!(rejected(SamplingParams { top_p: bad, ..d() }), "top_p");
        assert_eq!(rejected(SamplingParams { min_p: bad, ..d() }), "min_p");
        assert_eq!(
            rejected(SamplingParams {
                presence_penalty: bad,
                ..d()
            }),
            "presence_penalty"
        );
        assert_eq!(
            rejected(SamplingParams {
                frequency_penalty: bad,
                ..d()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            rejected(SamplingParams {
                repetition_penalty: bad,
                ..d()
            }),
            "repetition_penalty"
        );
    }
}

#[test]
fn error_message_is_readable() {
    let err = SamplingParams {
        temperature: 3.0,
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.to_string(), "temperature must be in [0, 2], got 3");
    let err = SamplingParams {
        top_p: f32::NAN,
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.to_string(), "top_p must be a finite number, got NaN");
}

#[test]
fn sampler_refuses_invalid_params() {
    let p = SamplingParams {
        top_p: 0.0,
        ..Default::default()
    };
    assert_eq!(Sampler::new(&p, 0, &[]).unwrap_err().param, "top_p");
}
