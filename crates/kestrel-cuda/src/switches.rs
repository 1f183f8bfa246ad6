//! Every `KESTREL_*` environment variable in one registry, and the one parser
//! of the CUDA backend's switches.
//!
//! The switches exist for A/B runs and for reference arithmetic; none is
//! needed to serve. They are read once, when a backend opens, into
//! [`Overrides`], which [`Plan::resolve`](crate::plan::Plan::resolve) turns
//! into the kernel choices. A misspelt name or value would otherwise change
//! nothing silently, so every `KESTREL_*` variable that the registry does not
//! know, and every value a switch does not take, is reported on stderr.
//!
//! The registry also lists the variables other crates read themselves (the
//! model cache, download endpoints, build and test settings), so that they do
//! not count as unknown; `docs/cuda.md` documents all of them in one table.

use std::sync::Once;

use kestrel_core::Result;

use crate::precision::Precision;

/// Where a variable is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// By the CUDA backend when it opens (parsed here).
    Backend,
    /// By the CUDA backend of a build with the `experiments` feature only.
    Experiment,
    /// By another crate at run time (`kestrel`, `kestrel-bench`).
    Elsewhere,
    /// By a build script (`kestrel-kernels`).
    Build,
    /// By tests and test scripts.
    Test,
}

/// One known variable.
#[derive(Clone, Copy, Debug)]
pub struct Switch {
    pub name: &'static str,
    pub scope: Scope,
    /// The values it takes (the first is the default); empty: free-form.
    pub values: &'static [&'static str],
}

const fn switch(name: &'static str, scope: Scope, values: &'static [&'static str]) -> Switch {
    Switch {
        name,
        scope,
        values,
    }
}

pub const PRECISION: &str = "KESTREL_CUDA_PRECISION";
pub const GRAPHS: &str = "KESTREL_CUDA_GRAPHS";
pub const ATTN_PREFILL: &str = "KESTREL_ATTN_PREFILL";
pub const ATTN_DECODE: &str = "KESTREL_ATTN_DECODE";
pub const GDN_PREFILL: &str = "KESTREL_GDN_PREFILL";
pub const GDN_STATE: &str = "KESTREL_GDN_STATE";
pub const MOE_GEMM: &str = "KESTREL_MOE_GEMM";
pub const MOE_TILES: &str = "KESTREL_MOE_TILES";
pub const NORM_FUSION: &str = "KESTREL_NORM_FUSION";
pub const HYPER_FUSION: &str = "KESTREL_HYPER_FUSION";
pub const MOE_PREFILL: &str = "KESTREL_MOE_PREFILL";
pub const DENSE_GEMM: &str = "KESTREL_DENSE_GEMM";
pub const LT_ALGO: &str = "KESTREL_LT_ALGO";
pub const PDL: &str = "KESTREL_CUDA_PDL";
pub const BATCH_INVARIANT: &str = "KESTREL_BATCH_INVARIANT";
pub const MIXED_STEPS: &str = "KESTREL_MIXED_STEPS";
pub const DECODE_SPLITS: &str = "KESTREL_DECODE_SPLITS";
pub const PROMPT_ROWS: &str = "KESTREL_PROMPT_ROWS";

/// Every `KESTREL_*` variable the project reads.
pub const REGISTRY: &[Switch] = &[
    switch(PRECISION, Scope::Backend, &["bf16", "f32"]),
    switch(GRAPHS, Scope::Backend, &["1", "0"]),
    switch(ATTN_PREFILL, Scope::Backend, &["wgmma", "v2", "v1"]),
    switch(ATTN_DECODE, Scope::Backend, &["fused", "unfused"]),
    switch(GDN_PREFILL, Scope::Backend, &["auto", "tf32", "3xtf32"]),
    switch(GDN_STATE, Scope::Backend, &["wgmma", "mma"]),
    switch(MOE_GEMM, Scope::Backend, &["wgmma", "mma"]),
    switch(MOE_TILES, Scope::Backend, &["wide", "narrow"]),
    switch(NORM_FUSION, Scope::Backend, &["on", "off"]),
    switch(BATCH_INVARIANT, Scope::Backend, &["0", "1"]),
    switch(MIXED_STEPS, Scope::Backend, &["split", "one"]),
    switch(DECODE_SPLITS, Scope::Backend, &["step", "sequence"]),
    switch(PROMPT_ROWS, Scope::Backend, &["invariant", "by-size"]),
    switch(MOE_PREFILL, Scope::Experiment, &["device", "host"]),
    switch(DENSE_GEMM, Scope::Experiment, &["cublas", "lt"]),
    switch(LT_ALGO, Scope::Experiment, &[]),
    switch(PDL, Scope::Experiment, &["0", "1"]),
    switch(HYPER_FUSION, Scope::Experiment, &["off", "on"]),
    switch("KESTREL_CACHE_DIR", Scope::Elsewhere, &[]),
    switch("KESTREL_HF_ENDPOINT", Scope::Elsewhere, &[]),
    switch("KESTREL_MODELSCOPE_ENDPOINT", Scope::Elsewhere, &[]),
    switch("KESTREL_BENCH_API_KEY", Scope::Elsewhere, &[]),
    switch("KESTREL_NVCC", Scope::Build, &[]),
    switch("KESTREL_REQUIRE_KERNELS", Scope::Build, &["0", "1"]),
    switch("KESTREL_LOAD_TEST_SECS", Scope::Test, &[]),
    switch("KESTREL_REQUIRE_CUDA", Scope::Test, &["0", "1"]),
    switch("KESTREL_BIN", Scope::Test, &[]),
];

fn known(name: &str) -> Option<&'static Switch> {
    REGISTRY.iter().find(|s| s.name == name)
}

/// The prefill attention kernel asked for (`KESTREL_ATTN_PREFILL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnPrefillChoice {
    /// wgmma where the GPU has it, else version 2 where its tiles fit, else
    /// version 1.
    #[default]
    Best,
    /// The mma.sync 128-query kernel where its tiles fit, else version 1.
    V2,
    /// The 64-query single-buffered kernel.
    V1,
}

/// The GDN chunked prefill's arithmetic asked for (`KESTREL_GDN_PREFILL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdnMathChoice {
    /// The precision's own: one TF32 pass in bf16, 3xTF32 in f32.
    #[default]
    Auto,
    Tf32,
    Tf32x3,
}

/// The parsed backend switches: what was asked for, before the device and
/// the precision have had their say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overrides {
    pub precision: Precision,
    pub graphs: bool,
    pub attn_prefill: AttnPrefillChoice,
    pub attn_decode_fused: bool,
    pub gdn_math: GdnMathChoice,
    /// Allow the wgmma GDN state pass (where the GPU has it).
    pub gdn_state_wgmma: bool,
    /// Allow the wgmma MoE expert GEMMs (where the GPU has them).
    pub moe_gemm_wgmma: bool,
    /// Allow 256-wide MoE expert GEMM tiles.
    pub moe_wide_tiles: bool,
    pub norm_fusion: bool,
    /// Flash-Next's fused hyper-connection kernels (`hc_norm`,
    /// `hc_low_rank`, `hc_gate_mix`; experiments only).
    pub hyper_fusion: bool,
    /// Route every prefill MoE block on the host (experiments only).
    pub moe_prefill_host: bool,
    /// The dense products through cuBLASLt (experiments only).
    pub dense_gemm_lt: bool,
    /// The cuBLASLt heuristic's result to take (experiments only).
    pub lt_algo: usize,
    /// Programmatic dependent launch (experiments only).
    pub pdl: bool,
    /// Every row's result independent of the other rows of its step.
    pub batch_invariant: bool,
    /// Run a step's decode and verify rows apart from its prefill chunks.
    pub split_mixed_steps: bool,
    /// Decode-shaped steps split K and the keys as for one sequence,
    /// whatever their sequence count.
    pub decode_splits_one_sequence: bool,
    /// Prompt rows computed alike whatever their pass's row count.
    pub invariant_prompts: bool,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides {
            precision: Precision::Bf16,
            graphs: true,
            attn_prefill: AttnPrefillChoice::Best,
            attn_decode_fused: true,
            gdn_math: GdnMathChoice::Auto,
            gdn_state_wgmma: true,
            moe_gemm_wgmma: true,
            moe_wide_tiles: true,
            norm_fusion: true,
            hyper_fusion: false,
            moe_prefill_host: false,
            dense_gemm_lt: false,
            lt_algo: 0,
            pdl: false,
            batch_invariant: false,
            split_mixed_steps: true,
            decode_splits_one_sequence: false,
            invariant_prompts: true,
        }
    }
}

/// Whether this build carries the experiments (`--features experiments`).
pub const EXPERIMENTS: bool = cfg!(feature = "experiments");

/// The reader of one environment: checks each value against the registry
/// and collects what it could not take.
struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    warnings: Vec<String>,
}

impl Reader<'_> {
    /// The value of a registered switch with listed values, or `None` when
    /// unset or not one of them (then a warning says so and the default holds).
    fn choice(&mut self, name: &str) -> Option<&'static str> {
        let switch = known(name).expect("a registered switch");
        let value = (self.lookup)(name)?;
        if switch.scope == Scope::Experiment && !EXPERIMENTS {
            let default = switch.values.first().copied();
            if Some(value.as_str()) != default {
                self.warnings.push(format!(
                    "{name}={value} is an experiment this build does not carry \
                     (build kestrel-cuda with --features experiments); ignored"
                ));
            }
            return None;
        }
        match switch.values.iter().find(|&&v| v == value) {
            Some(&v) => Some(v),
            None => {
                self.warnings.push(format!(
                    "{name}={value} is not one of {}; using {}",
                    switch.values.join(", "),
                    switch.values[0]
                ));
                None
            }
        }
    }

    /// A free-form number, or `None` (with a warning when it does not parse).
    fn number(&mut self, name: &str) -> Option<usize> {
        let value = (self.lookup)(name)?;
        if !EXPERIMENTS && known(name).is_some_and(|s| s.scope == Scope::Experiment) {
            self.warnings.push(format!(
                "{name}={value} is an experiment this build does not carry; ignored"
            ));
            return None;
        }
        let parsed = value.parse().ok();
        if parsed.is_none() {
            self.warnings
                .push(format!("{name}={value} is not a number; ignored"));
        }
        parsed
    }
}

impl Overrides {
    /// The switches as the process environment sets them; warnings go to
    /// stderr. Fails only on a precision it cannot take (running the wrong
    /// arithmetic would be worse than not starting).
    pub fn from_env() -> Result<Self> {
        warn_unknown_variables();
        let (overrides, warnings) = Self::parse(&|name| std::env::var(name).ok())?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(overrides)
    }

    /// The switches as `lookup` sets them, and what could not be taken.
    pub fn parse(lookup: &dyn Fn(&str) -> Option<String>) -> Result<(Self, Vec<String>)> {
        let mut r = Reader {
            lookup,
            warnings: Vec::new(),
        };
        let precision = match lookup(PRECISION) {
            None => Precision::Bf16,
            Some(v) => v.parse()?,
        };
        let d = Overrides::default();
        let overrides = Overrides {
            precision,
            graphs: r.choice(GRAPHS).map_or(d.graphs, |v| v != "0"),
            attn_prefill: match r.choice(ATTN_PREFILL) {
                Some("v2") => AttnPrefillChoice::V2,
                Some("v1") => AttnPrefillChoice::V1,
                _ => AttnPrefillChoice::Best,
            },
            attn_decode_fused: r.choice(ATTN_DECODE) != Some("unfused"),
            gdn_math: match r.choice(GDN_PREFILL) {
                Some("tf32") => GdnMathChoice::Tf32,
                Some("3xtf32") => GdnMathChoice::Tf32x3,
                _ => GdnMathChoice::Auto,
            },
            gdn_state_wgmma: r.choice(GDN_STATE) != Some("mma"),
            moe_gemm_wgmma: r.choice(MOE_GEMM) != Some("mma"),
            moe_wide_tiles: r.choice(MOE_TILES) != Some("narrow"),
            norm_fusion: r.choice(NORM_FUSION) != Some("off"),
            hyper_fusion: r.choice(HYPER_FUSION) == Some("on"),
            batch_invariant: r.choice(BATCH_INVARIANT) == Some("1"),
            split_mixed_steps: r.choice(MIXED_STEPS) != Some("one"),
            decode_splits_one_sequence: r.choice(DECODE_SPLITS) == Some("sequence"),
            invariant_prompts: r.choice(PROMPT_ROWS) != Some("by-size"),
            moe_prefill_host: r.choice(MOE_PREFILL) == Some("host"),
            dense_gemm_lt: r.choice(DENSE_GEMM) == Some("lt"),
            lt_algo: r.number(LT_ALGO).unwrap_or(d.lt_algo),
            pdl: r.choice(PDL) == Some("1"),
        };
        Ok((overrides, r.warnings))
    }
}

/// The `KESTREL_*` names among `names` that the registry does not know.
pub fn unknown_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|n| n.starts_with("KESTREL_") && known(n).is_none())
        .collect()
}

/// Report, once per process, every `KESTREL_*` variable of the environment
/// that no part of kestrel reads (a misspelling, or a retired experiment).
pub fn warn_unknown_variables() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        for name in unknown_names(names.iter().map(String::as_str)) {
            eprintln!(
                "warning: {name} is set but kestrel reads no such variable (docs/cuda.md lists them)"
            );
        }
    });
}

#[cfg(test)]
mod tests;
