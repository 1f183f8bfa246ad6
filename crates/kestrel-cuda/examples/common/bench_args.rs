//! Command-line handling shared by the micro-benchmarks: `--device N`, named
//! switches that select an older code path through its environment variable,
//! opening the CUDA backend, and a checksum of an output's bits.

use kestrel_cuda::CudaBackend;

/// A switch: its flag and the environment variable (and value) it sets. The
/// backend reads such variables once, when it starts, so they are set before.
pub struct Switch {
    pub flag: &'static str,
    pub var: &'static str,
    pub value: &'static str,
}

pub struct BenchArgs {
    pub device: usize,
    /// Flags of the switches given.
    pub on: Vec<&'static str>,
}

impl BenchArgs {
    pub fn has(&self, flag: &str) -> bool {
        self.on.contains(&flag)
    }
}

/// Parses `--device N` and the switches (exits with status 2 and the usage
/// line on anything else), then sets each given switch's variable and clears
/// the others', so the process runs exactly the selected paths.
pub fn parse(usage: &str, switches: &[Switch]) -> BenchArgs {
    let mut args = BenchArgs {
        device: 0,
        on: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--device" {
            match it.next().and_then(|v| v.parse().ok()) {
                Some(d) => args.device = d,
                None => fail(usage),
            }
        } else if let Some(s) = switches.iter().find(|s| s.flag == a) {
            args.on.push(s.flag);
        } else {
            fail(usage);
        }
    }
    // Cleared first, then set: several switches may share one variable.
    // SAFETY: single-threaded here, before anything reads the environment.
    for s in switches {
        unsafe { std::env::remove_var(s.var) };
    }
    for s in switches.iter().filter(|s| args.has(s.flag)) {
        unsafe { std::env::set_var(s.var, s.value) };
    }
    args
}

fn fail(usage: &str) -> ! {
    eprintln!("usage: {usage}");
    std::process::exit(2);
}

/// The backend on `device`, or `None` after saying why there is none.
pub fn open(device: usize) -> Option<CudaBackend> {
    match CudaBackend::new(device) {
        Ok(g) => Some(g),
        Err(e) => {
            println!("no CUDA: {e}");
            None
        }
    }
}

/// FNV-1a over the bits of `values`: equal checksums mean bit-identical
/// outputs, to compare kernel variants.
#[allow(dead_code)] // not every benchmark prints one
pub fn checksum(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
