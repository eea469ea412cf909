//! The HTTP endpoint of `gpushim metrics --listen`: hyper on a one-thread tokio runtime, which
//! answers many clients at once and bounds every connection in number and in time, so that no
//! client (idle, trickling or flooding) holds a scrape back.
//!
//! - **Connections**: at most [`MAX_CONNECTIONS`]. One more takes the place of the oldest
//!   connection that is waiting for its client (no request in progress, and the client was given
//!   the chance to send one and did not); when every connection is busy or has just opened, the
//!   new one is closed at once.
//! - **Time**: a request's head must arrive within [`HEADER_TIMEOUT`] of the connection opening
//!   or of the previous answer (hyper's header read timeout, which is also the keep-alive idle
//!   timeout); an answer is given within [`ANSWER_TIMEOUT`] (503 past it); a connection lives at
//!   most [`CONNECTION_LIFETIME`], then closes after the answer in progress.
//! - **Work**: the figures are read on a blocking thread, one reading at a time; requests that
//!   arrive during a reading wait for the next one (never for an older one), so a burst of
//!   scrapes costs two readings.
//! - **Threads**: the runtime's one thread and at most [`BLOCKING_THREADS`] for the readings
//!   (a reading with NVML's figures adds the short-lived readers of `gpushim __probe`).
//! - **Stop**: SIGTERM or SIGINT stops the server within [`GRACE`].

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;

/// Connections open at once.
pub const MAX_CONNECTIONS: usize = 64;
/// From the connection's start, or the previous answer, to the end of a request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// From a request's head to its answer (reading the figures included).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection's whole life (then it closes after the answer in progress).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// What an answer in progress gets to finish, at the end of a connection's life or at a stop.
pub const GRACE: Duration = Duration::from_secs(1);
/// Threads that read the figures (besides the runtime's own).
pub const BLOCKING_THREADS: usize = 2;

/// The content type of the text exposition format.
pub const EXPOSITION_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why the server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// The runtime or the signal handlers could not be set up.
    Setup(std::io::Error),
    /// The address cannot be listened on (taken, not local, not an address).
    Listen { addr: String, source: std::io::Error },
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Setup(e) => write!(f, "cannot set up the server: {e}"),
            ServeError::Listen { addr, source } => write!(f, "cannot listen on {addr}: {source} (give a free local address and port, like 127.0.0.1:9400)"),
        }
    }
}

/// Reads the figures and writes the exposition (blocking).
pub type Collect = dyn Fn() -> Result<String, String> + Send + Sync;

/// Serves `collect`'s exposition on `addr` until SIGTERM or SIGINT; returns the signal's name.
/// `on_listening` is told the address actually bound (for `127.0.0.1:0`).
pub fn serve(addr: &str, collect: Arc<Collect>, on_listening: impl FnOnce(std::net::SocketAddr)) -> Result<&'static str, ServeError> {
    // A client that resets its connection must not end the server: hyper writes with writev,
    // which (unlike std's send) raises SIGPIPE, and main() restored its default action.
    // SAFETY: changing a signal's disposition; no handler runs our code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(Duration::from_secs(5))
        .build()
        .map_err(ServeError::Setup)?;
    let stopped = runtime.block_on(async move {
        let mut term = signal(SignalKind::terminate()).map_err(ServeError::Setup)?;
        let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Setup)?;
        let listener = TcpListener::bind(addr).await.map_err(|source| ServeError::Listen { addr: addr.to_string(), source })?;
        if let Ok(local) = listener.local_addr() {
            on_listening(local);
        }
        let table = Arc::new(Table::default());
        let readings = Arc::new(Readings { collect, last: tokio::sync::Mutex::new(None) });
        loop {
            tokio::select! {
                _ = term.recv() => return Ok("SIGTERM"),
                _ = int.recv() => return Ok("SIGINT"),
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        // beyond the cap with no connection to give way: closed here (dropped)
                        if let Some(slot) = table.admit() {
                            tokio::spawn(connection(stream, slot, readings.clone()));
                            // its first read before the next accept: only a connection that
                            // has waited for its client may be made to give way
                            tokio::task::yield_now().await;
                        }
                    }
                    // out of descriptors and the like: let connections end rather than spin
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                },
            }
        }
    });
    // connections still open are dropped; a reading under way gets GRACE to end
    runtime.shutdown_timeout(GRACE);
    stopped
}

/// The open connections, oldest first.
#[derive(Default)]
struct Table {
    slots: Mutex<Vec<Arc<Slot>>>,
    next: std::sync::atomic::AtomicU64,
}

/// One open connection, as the table sees it.
struct Slot {
    id: u64,
    /// A request is being answered.
    busy: AtomicBool,
    /// The client was read from and had nothing (more) to send: it had its chance.
    waited: AtomicBool,
    /// Told when the connection must give way to a newer one.
    evict: Notify,
}

impl Table {
    /// A place for a new connection: a free one, or the place of the oldest connection waiting
    /// for its client (told to close); none when every connection is busy or new.
    fn admit(self: &Arc<Self>) -> Option<SlotGuard> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.len() >= MAX_CONNECTIONS {
            let idle = slots.iter().position(|s| s.waited.load(Relaxed) && !s.busy.load(Relaxed))?;
            slots.remove(idle).evict.notify_one();
        }
        let slot = Arc::new(Slot { id: self.next.fetch_add(1, Relaxed), busy: AtomicBool::new(false), waited: AtomicBool::new(false), evict: Notify::new() });
        slots.push(slot.clone());
        Some(SlotGuard { table: self.clone(), slot })
    }
}

/// A connection's place in the table, given back when the connection ends.
struct SlotGuard {
    table: Arc<Table>,
    slot: Arc<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut slots = self.table.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|s| s.id != self.slot.id);
    }
}

/// One connection, served until the client closes it, a timeout, its eviction or its lifetime.
async fn connection(stream: TcpStream, guard: SlotGuard, readings: Arc<Readings>) {
    let slot = guard.slot.clone();
    let io = Watched { inner: TokioIo::new(stream), slot: slot.clone() };
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let (slot, readings) = (slot.clone(), readings.clone());
        async move {
            slot.busy.store(true, Relaxed);
            let arrived = Instant::now();
            let answer = match tokio::time::timeout(ANSWER_TIMEOUT, answer(&req, &readings, arrived)).await {
                Ok(a) => a,
                Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "gpushim metrics: reading the figures took too long\n"),
            };
            slot.busy.store(false, Relaxed);
            Ok::<_, Infallible>(answer)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).keep_alive(true).max_buf_size(16 * 1024);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let lifetime = tokio::time::sleep(CONNECTION_LIFETIME);
    tokio::pin!(lifetime);
    tokio::select! {
        biased; // (the answer in progress is written before an eviction is looked at)
        _ = conn.as_mut() => {}
        _ = guard.slot.evict.notified() => {}
        _ = &mut lifetime => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(GRACE, conn).await;
        }
    }
    drop(guard);
}

/// The answer to one request.
async fn answer(req: &Request<hyper::body::Incoming>, readings: &Readings, arrived: Instant) -> Response<Full<Bytes>> {
    let readable = req.method() == Method::GET || req.method() == Method::HEAD;
    if !readable {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "gpushim metrics: GET /metrics\n");
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => match &*readings.get(arrived).await {
            Ok(body) => {
                let mut r = Response::new(Full::new(body.clone()));
                r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(EXPOSITION_TYPE));
                r
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("gpushim metrics: {e}\n")),
        },
        "/" => text(StatusCode::OK, "gpushim metrics: see /metrics\n"),
        _ => text(StatusCode::NOT_FOUND, "not found; see /metrics\n"),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// A reading's exposition, or why there is none.
type Reading = Arc<Result<Bytes, String>>;

/// The figures, read one reading at a time.
struct Readings {
    collect: Arc<Collect>,
    /// The last reading, and when it started.
    last: tokio::sync::Mutex<Option<(Instant, Reading)>>,
}

impl Readings {
    /// A reading started at or after `arrived`: the one that started since, or a new one.
    async fn get(&self, arrived: Instant) -> Reading {
        let mut last = self.last.lock().await;
        if let Some((started, r)) = last.as_ref() {
            if *started >= arrived {
                return r.clone();
            }
        }
        let started = Instant::now();
        let collect = self.collect.clone();
        let r = match tokio::task::spawn_blocking(move || collect()).await {
            Ok(r) => r.map(Bytes::from),
            Err(e) => Err(format!("reading the figures failed: {e}")),
        };
        let r = Arc::new(r);
        *last = Some((started, r.clone()));
        r
    }
}

/// The connection's socket, noting when a read finds nothing: the client had its chance.
struct Watched {
    inner: TokioIo<TcpStream>,
    slot: Arc<Slot>,
}

impl hyper::rt::Read for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: hyper::rt::ReadBufCursor<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_pending() {
            self.slot.waited.store(true, Relaxed);
        }
        r
    }
}

impl hyper::rt::Write for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}
