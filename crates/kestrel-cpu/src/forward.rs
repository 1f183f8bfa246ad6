//! Backends that wrap the CPU backend (tests that watch or change one
//! operation) forward the rest with [`forward_required_to_cpu!`].

/// The `Backend` methods without a default, each forwarded to the CPU
/// backend in field `$field`, for use inside `impl Backend for ...` of a
/// wrapper whose `Tensor`, `Weight`, `Cache` and `BlockKeys` are the CPU
/// backend's. The trait's defaulted methods stay the trait's unless the
/// wrapper forwards them too.
#[macro_export]
macro_rules! forward_required_to_cpu {
    ($field:tt) => {
        fn new_block_keys(
            &self,
            spec: &::kestrel_core::AttentionSpec,
        ) -> ::kestrel_core::block_attention::HostBlockKeys {
            self.$field.new_block_keys(spec)
        }
        fn block_keys_len(&self, keys: &::kestrel_core::block_attention::HostBlockKeys) -> usize {
            self.$field.block_keys_len(keys)
        }
        fn append_block_keys(
            &self,
            keys: &mut ::kestrel_core::block_attention::HostBlockKeys,
            kv: &$crate::CpuTensor,
            k_norm: &$crate::CpuWeight,
            spec: &::kestrel_core::AttentionSpec,
            first_position: usize,
        ) {
            self.$field
                .append_block_keys(keys, kv, k_norm, spec, first_position)
        }
        fn keep_block_keys(
            &self,
            keys: &mut ::kestrel_core::block_attention::HostBlockKeys,
            range: std::ops::Range<usize>,
        ) {
            self.$field.keep_block_keys(keys, range)
        }
        fn block_attention(
            &self,
            qkv: &$crate::CpuTensor,
            q_norm: &$crate::CpuWeight,
            k_norm: &$crate::CpuWeight,
            keys: &mut ::kestrel_core::block_attention::HostBlockKeys,
            spec: &::kestrel_core::AttentionSpec,
            first_position: usize,
        ) -> $crate::CpuTensor {
            self.$field
                .block_attention(qkv, q_norm, k_norm, keys, spec, first_position)
        }
        fn upload(
            &self,
            t: &::kestrel_core::HostTensor,
        ) -> ::kestrel_core::Result<$crate::CpuWeight> {
            self.$field.upload(t)
        }
        fn stack_rows(
            &self,
            parts: Vec<$crate::CpuWeight>,
        ) -> ::kestrel_core::Result<$crate::CpuWeight> {
            self.$field.stack_rows(parts)
        }
        fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> $crate::CpuTensor {
            self.$field.from_host(rows, cols, data)
        }
        fn to_host(&self, t: &$crate::CpuTensor) -> Vec<f32> {
            self.$field.to_host(t)
        }
        fn dims(&self, t: &$crate::CpuTensor) -> (usize, usize) {
            self.$field.dims(t)
        }
        fn new_cache(
            &self,
            spec: &::kestrel_core::CacheSpec,
        ) -> ::kestrel_core::Result<$crate::CpuCache> {
            self.$field.new_cache(spec)
        }
        fn zero_state(&self, cache: &mut $crate::CpuCache, slot: u32) {
            self.$field.zero_state(cache, slot)
        }
        fn copy_state(&self, cache: &mut $crate::CpuCache, src: u32, dst: u32) {
            self.$field.copy_state(cache, src, dst)
        }
        fn embedding(&self, table: &$crate::CpuWeight, ids: &[u32]) -> $crate::CpuTensor {
            self.$field.embedding(table, ids)
        }
        fn matmul(&self, x: &$crate::CpuTensor, w: &$crate::CpuWeight) -> $crate::CpuTensor {
            self.$field.matmul(x, w)
        }
        fn rms_norm(
            &self,
            x: &$crate::CpuTensor,
            w: &$crate::CpuWeight,
            eps: f32,
        ) -> $crate::CpuTensor {
            self.$field.rms_norm(x, w, eps)
        }
        fn add_rms_norm(
            &self,
            r: &mut $crate::CpuTensor,
            x: &$crate::CpuTensor,
            w: &$crate::CpuWeight,
            eps: f32,
        ) -> $crate::CpuTensor {
            self.$field.add_rms_norm(r, x, w, eps)
        }
        fn add_assign(&self, a: &mut $crate::CpuTensor, b: &$crate::CpuTensor) {
            self.$field.add_assign(a, b)
        }
        fn swiglu(&self, gate_up: &$crate::CpuTensor) -> $crate::CpuTensor {
            self.$field.swiglu(gate_up)
        }
        fn gather_rows(&self, x: &$crate::CpuTensor, rows: &[usize]) -> $crate::CpuTensor {
            self.$field.gather_rows(x, rows)
        }
        fn attention(
            &self,
            proj: &$crate::CpuTensor,
            w: &::kestrel_core::AttentionWeights<$crate::CpuWeight>,
            spec: &::kestrel_core::AttentionSpec,
            cache: &mut $crate::CpuCache,
            layer: usize,
            batch: &::kestrel_core::ForwardBatch,
        ) -> $crate::CpuTensor {
            self.$field.attention(proj, w, spec, cache, layer, batch)
        }
        fn moe(
            &self,
            x: &$crate::CpuTensor,
            w: &::kestrel_core::MoeWeights<$crate::CpuWeight>,
            spec: &::kestrel_core::MoeSpec,
        ) -> $crate::CpuTensor {
            self.$field.moe(x, w, spec)
        }
        fn gated_delta_net(
            &self,
            proj: &$crate::CpuTensor,
            w: &::kestrel_core::GdnWeights<$crate::CpuWeight>,
            spec: &::kestrel_core::GdnSpec,
            cache: &mut $crate::CpuCache,
            layer: usize,
            batch: &::kestrel_core::ForwardBatch,
        ) -> $crate::CpuTensor {
            self.$field
                .gated_delta_net(proj, w, spec, cache, layer, batch)
        }
    };
}
