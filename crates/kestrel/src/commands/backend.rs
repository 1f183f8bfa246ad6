//! `--backend auto|cpu|cuda` of the commands that run a model.
//!
//! `auto` (the default) runs on the GPU when this build can open one, and on
//! the CPU otherwise, saying once on stderr why: the README's first command
//! then works on any machine, and a GPU machine needs no flag.

use std::fmt::Display;

use anyhow::{Context, Result};
use kestrel_cuda::CudaBackend;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// CUDA when a device is present and the kernels are built, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

/// The backend a command runs on.
pub enum Chosen<C> {
    /// `fallback`: why `auto` did not take the GPU (`None` when `cpu` was asked for).
    Cpu {
        fallback: Option<String>,
    },
    Cuda(C),
}

/// Picks the backend for `kind`; `open_cuda` runs only for `auto` and `cuda`.
/// `cuda` fails when the GPU cannot be opened; `auto` falls back to the CPU.
pub fn choose<C, E: Display>(
    kind: BackendKind,
    open_cuda: impl FnOnce() -> std::result::Result<C, E>,
) -> Result<Chosen<C>> {
    match kind {
        BackendKind::Cpu => Ok(Chosen::Cpu { fallback: None }),
        BackendKind::Cuda => open_cuda()
            .map(Chosen::Cuda)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("cannot open the CUDA backend"),
        BackendKind::Auto => Ok(match open_cuda() {
            Ok(cuda) => Chosen::Cuda(cuda),
            Err(e) => Chosen::Cpu {
                fallback: Some(format!("{e}")),
            },
        }),
    }
}

/// [`choose`] with the real CUDA backend on device `ordinal`; a fallback to
/// the CPU is reported on stderr.
pub fn open(kind: BackendKind, ordinal: usize) -> Result<Chosen<CudaBackend>> {
    let chosen = choose(kind, || CudaBackend::new(ordinal))?;
    if let Chosen::Cpu {
        fallback: Some(why),
    } = &chosen
    {
        eprintln!("kestrel: running on the CPU (--backend auto: {why})");
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_gpu() -> std::result::Result<u8, String> {
        Err("no CUDA driver found".into())
    }

    fn gpu() -> std::result::Result<u8, String> {
        Ok(7)
    }

    #[test]
    fn auto_takes_the_gpu_when_it_opens() {
        assert!(matches!(
            choose(BackendKind::Auto, gpu),
            Ok(Chosen::Cuda(7))
        ));
    }

    #[test]
    fn auto_falls_back_to_the_cpu_saying_why() {
        match choose(BackendKind::Auto, no_gpu).unwrap() {
            Chosen::Cpu {
                fallback: Some(why),
            } => assert_eq!(why, "no CUDA driver found"),
            _ => panic!("auto without a GPU did not fall back to the CPU"),
        }
    }

    #[test]
    fn cuda_without_a_gpu_is_an_error() {
        let err = match choose(BackendKind::Cuda, no_gpu) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("--backend cuda without a GPU did not fail"),
        };
        assert_eq!(err, "cannot open the CUDA backend: no CUDA driver found");
    }

    #[test]
    fn cpu_never_opens_the_gpu() {
        let chosen = choose(BackendKind::Cpu, || -> std::result::Result<u8, String> {
            panic!("--backend cpu tried to open the GPU")
        });
        assert!(matches!(chosen, Ok(Chosen::Cpu { fallback: None })));
    }

    /// The machine the tests run on decides what `auto` picks; either way
    /// the real backend's choice must not fail.
    #[test]
    fn auto_with_the_real_backend_always_picks_one() {
        assert!(open(BackendKind::Auto, 0).is_ok());
    }
}
