//! Launcher: start from a profile, wait for health, stop; startup failures.

use std::path::Path;

use kestrel_bench::launcher::start;
use kestrel_bench::profile::Profile;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn profile(program: &str, args: &[&str], port: u16, timeout_s: u64) -> Profile {
    toml::from_str(&format!(
        "schema_version = 1\nname = \"t\"\nprogram = {program:?}\nargs = {args:?}\nport = {port}\nstartup_timeout_s = {timeout_s}\nstop_grace_s = 5\n"
    ))
    .unwrap()
}

fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_waits_for_health_and_stops() {
    if !have("python3") {
        eprintln!("python3 not found: launcher health test skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // python's static file server answers 200 on /health once the file exists.
    std::fs::write(dir.path().join("health"), "ok").unwrap();
    let port = free_port();
    let p = profile(
        "python3",
        &[
            "-m",
            "http.server",
            "{port}",
            "--bind",
            "{host}",
            "--directory",
            "{model_dir}",
        ],
        port,
        30,
    );
    let mut server = start(&p, Some(dir.path()), &dir.path().join("server.log"))
        .await
        .unwrap();
    assert_eq!(server.base_url, format!("http://127.0.0.1:{port}"));
    let pid = server.pid().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let status = server.stop().await.unwrap();
    assert!(!status.success(), "SIGTERM should end the server: {status}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port still open after stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_timeout_and_early_exit_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let p = profile("sleep", &["30"], free_port(), 1);
    let t = std::time::Instant::now();
    let err = start(&p, None, &log).await.err().unwrap().to_string();
    assert!(err.contains("not healthy"), "{err}");
    assert!(
        t.elapsed().as_secs() < 10,
        "stop did not kill the process quickly"
    );

    let p = profile(
        "sh",
        &["-c", "echo model folder unreadable >&2; exit 3"],
        free_port(),
        30,
    );
    let err = start(&p, None, &log).await.err().unwrap().to_string();
    assert!(
        err.contains("exited during startup") && err.contains("model folder unreadable"),
        "{err}"
    );

    let p = profile("kestrel-bench-no-such-program", &[], free_port(), 1);
    assert!(start(&p, None, &log).await.is_err());
}
