"""Tiny config.json contents for the four architectures.

Field names and shapes follow the real Hugging Face repos (Qwen3-8B, Qwen3-30B-A3B,
Qwen3.6-35B-A3B, Qwen3-Next-80B-A3B); only the sizes are shrunk. Every model keeps the real
structure: GQA 4:2, head_dim 32, MoE 8 experts top-2, the 3:1 linear/full attention pattern
with two full-attention layers, Gated DeltaNet with twice as many value heads as key heads.
"""

VOCAB = 512
HIDDEN = 64
EPS = 1e-6


def qwen3_config() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "max_window_layers": 4,
        "num_attention_heads": 4,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def qwen3_moe_config() -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "decoder_sparse_step": 1,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "max_window_layers": 4,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def hybrid_layer_types(num_layers: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)]


def qwen3_5_moe_config() -> dict:
    """The multimodal wrapper form of Qwen3.6-35B-A3B: text fields under text_config, a (tiny,
    unused) vision tower under vision_config."""
    text = {
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "full_attention_interval": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "layer_types": hybrid_layer_types(8),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 32,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "moe_intermediate_size": 32,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 8,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": EPS,
        # 8 rotary dims (head_dim 32 x 0.25) = 4 frequencies, so the mRoPE sections sum to 4.
        # Text-only positions are equal in all three rows: this reduces to 1-D RoPE.
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [2, 1, 1],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 48,
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    vision = {
        "model_type": "qwen3_5_moe",
        "deepstack_visual_indexes": [],
        "depth": 1,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 16,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 32,
        "num_heads": 2,
        "num_position_embeddings": 16,
        "out_hidden_size": HIDDEN,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "image_token_id": 503,
        "video_token_id": 504,
        "vision_start_token_id": 505,
        "vision_end_token_id": 506,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": vision,
    }


def qwen3_next_config() -> dict:
    """Flat, without layer_types, as Qwen3-Next-80B-A3B ships it: the layer pattern comes from
    full_attention_interval and RoPE from the legacy top-level fields."""
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "decoder_sparse_step": 1,
        "full_attention_interval": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 32,
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 8,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 48,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def qwen4_exp_config() -> dict:
    """Qwen3.8-Flash-Next in its multimodal wrapper form, shrunk: the 3:1 Gated DeltaNet /
    sparse-attention pattern (the real config says "full_attention"; transformers reads it as
    "qwen_sparse_attention"), a QSA indexer whose budget (16 tokens = 4 blocks of 4) is far
    below the prompt lengths, four hyper-connection streams, PLE on decoder layer 0 with the
    real n-gram structure (2- and 3-grams x 8 heads) over prime vocabularies just above 1000,
    the table stored in 4 shards, and the sigmoid Gated DeltaNet output gate."""
    text = {
        "model_type": "qwen4_exp_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "layer_types": hybrid_layer_types(8),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 32,
        "max_position_embeddings": 4096,
        "moe_intermediate_size": 32,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "num_hidden_layers": 8,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": EPS,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [2, 1, 1],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 48,
        "use_cache": True,
        "vocab_size": VOCAB,
        "hc_count": 4,
        "hc_lowrank": 8,
        "ple_layer_ids": [1],
        "ple_embed_dim": HIDDEN,
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "heads_per_ngram": 8,
        "ngram_vocab_size_base": 1000,
        "make_ngram_vocab_size_divisible_by": 128,
        "seed": 1234,
        "split_ngram_parts": 4,
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 16,
        "indexer_compress_ratio": 4,
        "output_gate_type": "sigmoid",
    }
    vision = {
        "model_type": "qwen4_exp_vision",
        "deepstack_visual_indexes": [],
        "depth": 1,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 16,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 32,
        "num_heads": 2,
        "num_position_embeddings": 16,
        "out_hidden_size": HIDDEN,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "image_token_id": 503,
        "video_token_id": 504,
        "vision_start_token_id": 505,
        "vision_end_token_id": 506,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": vision,
    }
