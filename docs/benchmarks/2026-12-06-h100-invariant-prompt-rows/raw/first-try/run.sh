#!/usr/bin/env bash
# The first run of tests/gpu/prefix_hit.rs, before prompt steps were kept out
# of the decode recordings: a one-token tail replayed the graph a decode step
# had recorded and differed. T: the GPU test binary.
KESTREL_REQUIRE_CUDA=1 timeout 200 T --test-threads=1 --nocapture prefix_hit > prefix_hit.txt 2>&1
