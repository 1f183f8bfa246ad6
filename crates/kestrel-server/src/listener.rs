//! The HTTP/1 accept loop. It replaces `axum::serve` so that hyper's own
//! header limits can be raised: hyper answers a request whose headers
//! overflow them with a bare 431 before any layer runs, so they sit well
//! above the server's own limits ([`crate::header_limit`]), which answer
//! with an error body.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::header_limit::{MAX_HEADER_BYTES, MAX_HEADERS};

/// hyper's read buffer: the whole head must fit in it.
const HYPER_MAX_BUF_BYTES: usize = 16 * MAX_HEADER_BYTES;
/// hyper parses at most this many headers.
const HYPER_MAX_HEADERS: usize = 10 * MAX_HEADERS;
/// A client that has not sent its headers by then is dropped (slowloris).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// After a failed accept (e.g. out of file descriptors), wait before retrying.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` resolves, then stops accepting
/// and waits for the open connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .max_buf_size(HYPER_MAX_BUF_BYTES)
        .max_headers(HYPER_MAX_HEADERS)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Tokens are small writes a few milliseconds apart: without
        // TCP_NODELAY, Nagle's algorithm holds them until the client's
        // delayed ACK and streams arrive in bursts.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
