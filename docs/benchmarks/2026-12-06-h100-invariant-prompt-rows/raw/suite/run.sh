#!/usr/bin/env bash
# The whole GPU suite on the final code (prefix_hit first, with its output).
# T: the test binary of `cargo test -p kestrel-cuda --features gpu-tests`.
set -u
export KESTREL_REQUIRE_CUDA=1
timeout 200 T --test-threads=1 --nocapture prefix_hit > prefix_hit.txt 2>&1
timeout 500 T --test-threads=1 --skip prefix_hit > gpu_tests.txt 2>&1
