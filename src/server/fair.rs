//! What keeps the node API fair to its clients ([`super::Limits`]): the
//! pool of connections that have not authenticated yet ([`Unauthenticated`]),
//! the caps per node and per namespace on log followers and upgraded streams
//! ([`Quota`]), and the deadlines on writes to a client ([`WriteDeadline`]
//! for the socket, [`WriteWatch`] and [`Watched`] for response bodies that
//! an HTTP/2 client's flow control holds back).

use std::collections::{BTreeMap, HashMap};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The connections that have not authenticated yet, oldest first: accepted
/// and still in their TLS handshake, or served without a client certificate
/// and with no request let through yet. At most `max` of them are open; a
/// new connection beyond that closes the oldest, so a flood of connections
/// that never authenticate churns through its own connections and cannot
/// keep out a newcomer (the API server's among them) for longer than it
/// takes the flood to open `max` more.
#[derive(Debug)]
pub(super) struct Unauthenticated {
    max: usize,
    inner: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    next: u64,
    /// Each waiting connection's close signal, by admission order.
    open: BTreeMap<u64, CancellationToken>,
    /// Connections closed to make room, for the log.
    evicted: u64,
}

impl Unauthenticated {
    /// A pool of at most `max` connections (at least one).
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            inner: Mutex::new(Pool::default()),
        })
    }

    /// Admits a newly accepted connection, telling the oldest waiting one
    /// to close when the pool is full.
    pub(super) fn admit(self: &Arc<Self>) -> Ticket {
        let mut pool = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while pool.open.len() >= self.max {
            let Some((_, oldest)) = pool.open.pop_first() else {
                break;
            };
            oldest.cancel();
            pool.evicted = pool.evicted.saturating_add(1);
            if pool.evicted.is_power_of_two() {
                warn!(
                    max = self.max,
                    closed = pool.evicted,
                    "node API: too many connections without credentials; closing the oldest"
                );
            }
        }
        let id = pool.next;
        pool.next = pool.next.wrapping_add(1);
        let closed = CancellationToken::new();
        pool.open.insert(id, closed.clone());
        Ticket {
            pool: self.clone(),
            id,
            closed,
        }
    }

    /// How many connections wait to authenticate now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .len()
    }
}

/// A connection's place in the [`Unauthenticated`] pool; dropping it (the
/// connection authenticated, or closed) gives the place back.
#[derive(Debug)]
pub(super) struct Ticket {
    pool: Arc<Unauthenticated>,
    id: u64,
    closed: CancellationToken,
}

impl Ticket {
    /// Cancelled when the pool closes this connection to make room.
    pub(super) fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pool
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .remove(&self.id);
    }
}

/// A connection's [`Ticket`], shared with its requests: the auth filter
/// lets it go once a request on the connection is authenticated and
/// authorized ([`Admission::admitted`]).
#[derive(Clone, Debug, Default)]
pub struct Admission(Arc<Mutex<Option<Ticket>>>);

impl Admission {
    pub(super) fn waiting(ticket: Option<Ticket>) -> Self {
        Self(Arc::new(Mutex::new(ticket)))
    }

    /// The connection has proven who it is and that it may use the node
    /// API: it leaves the pool of unauthenticated connections.
    pub fn admitted(&self) {
        let ticket = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(ticket);
    }
}

/// Why a [`Quota`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Full {
    /// The node's cap is reached.
    Node,
    /// The namespace's cap is reached.
    Namespace,
}

/// A cap on something held open (followed logs, upgraded streams) for the
/// whole node and for each namespace, so that one namespace cannot take
/// what the node has.
#[derive(Debug)]
pub(super) struct Quota {
    per_node: usize,
    per_namespace: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_namespace: HashMap<String, usize>,
}

impl Quota {
    /// At most `per_node` at once, `per_namespace` of them in one namespace.
    pub(super) fn new(per_node: usize, per_namespace: usize) -> Arc<Self> {
        Arc::new(Self {
            per_node,
            per_namespace,
            held: Mutex::default(),
        })
    }

    /// One more for `namespace`, held until the permit drops.
    pub(super) fn try_take(self: &Arc<Self>, namespace: &str) -> Result<Permit, Full> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.total >= self.per_node {
            return Err(Full::Node);
        }
        let n = held.by_namespace.get(namespace).copied().unwrap_or(0);
        if n >= self.per_namespace {
            return Err(Full::Namespace);
        }
        held.total += 1;
        held.by_namespace.insert(namespace.to_string(), n + 1);
        Ok(Permit {
            quota: self.clone(),
            namespace: namespace.to_string(),
        })
    }
}

/// One held place of a [`Quota`].
#[derive(Debug)]
pub(super) struct Permit {
    quota: Arc<Quota>,
    namespace: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self
            .quota
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_namespace.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_namespace.remove(&self.namespace);
            }
        }
    }
}

/// A connection's socket whose writes fail with `TimedOut` once one has
/// waited longer than `timeout` for the client to take bytes (a client that
/// stops reading, its TCP window shut). Reads pass through.
#[derive(Debug)]
pub(super) struct WriteDeadline<T> {
    inner: T,
    timeout: Duration,
    /// Set while a write waits: when it fails.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Told of every write the client takes, when that is progress of the
    /// connection's one response (HTTP/1.1).
    progress: Option<Arc<WriteWatch>>,
}

impl<T> WriteDeadline<T> {
    pub(super) fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
            progress: None,
        }
    }

    /// Bytes the client takes relieve `watch`: on HTTP/1.1, where a
    /// response's bytes are the only ones written while it is sent, a
    /// slow client that still reads is not stalled. Not for HTTP/2, whose
    /// control frames (a PING's answer) flow while a stream's window stays
    /// shut.
    pub(super) fn relieving(mut self, watch: Arc<WriteWatch>) -> Self {
        self.progress = Some(watch);
        self
    }

    /// The result of a write-side poll, failed when it has been pending
    /// past the deadline.
    fn check<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            if let (Some(watch), Poll::Ready(Ok(_))) = (&self.progress, &polled) {
                watch.progressed();
            }
            return polled;
        }
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took no bytes within the write deadline",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.check(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.check(cx, polled)
    }
}

/// The response bodies of one connection that wait for the client: a body
/// is owed a poll from when it is handed to the connection and after each
/// frame it yields, until the connection asks for its next frame (for
/// HTTP/2, once the client's flow-control window lets the last one out).
/// The connection is stalled when a body has been owed for the write
/// deadline and no owed body has been relieved within it either (on
/// HTTP/1.1, nor any byte taken by the client, [`WriteDeadline::relieving`]):
/// a client that opens no window stalls its connection, while a busy
/// connection with one slow stream among others that flow does not.
#[derive(Debug)]
pub(super) struct WriteWatch {
    state: Mutex<Owed>,
    changed: tokio::sync::Notify,
}

#[derive(Debug)]
struct Owed {
    next: u64,
    since: HashMap<u64, Instant>,
    /// When an owed body was last polled (or finished).
    relieved: Instant,
}

impl WriteWatch {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(Owed {
                next: 0,
                since: HashMap::new(),
                relieved: Instant::now(),
            }),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Owed> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new body, owed its first poll.
    fn register(&self) -> u64 {
        let id = {
            let mut s = self.lock();
            let id = s.next;
            s.next = s.next.wrapping_add(1);
            s.since.insert(id, Instant::now());
            id
        };
        self.changed.notify_one();
        id
    }

    /// Body `id` was polled (or is done).
    fn relieve(&self, id: u64) {
        let mut s = self.lock();
        if s.since.remove(&id).is_some() {
            s.relieved = Instant::now();
        }
    }

    /// The client took bytes of the connection's one response.
    fn progressed(&self) {
        self.lock().relieved = Instant::now();
    }

    /// Body `id` yielded a frame: owed its next poll.
    fn owe(&self, id: u64) {
        self.lock().since.insert(id, Instant::now());
        self.changed.notify_one();
    }

    /// Completes once the connection has stalled for `timeout`.
    pub(super) async fn stalled(&self, timeout: Duration) {
        loop {
            let at = {
                let s = self.lock();
                s.since
                    .values()
                    .min()
                    .map(|oldest| (*oldest).max(s.relieved) + timeout)
            };
            match at {
                None => self.changed.notified().await,
                Some(at) if at <= Instant::now() => return,
                Some(at) => tokio::time::sleep_until(at).await,
            }
        }
    }
}

/// A response body under a connection's [`WriteWatch`], holding `guard`
/// (the connection's in-flight count) until it is done or dropped.
pub(super) struct Watched<G> {
    inner: axum::body::Body,
    watch: Arc<WriteWatch>,
    id: u64,
    _guard: G,
}

impl<G> Watched<G> {
    pub(super) fn new(inner: axum::body::Body, watch: Arc<WriteWatch>, guard: G) -> Self {
        let id = watch.register();
        Self {
            inner,
            watch,
            id,
            _guard: guard,
        }
    }
}

impl<G: Unpin> Body for Watched<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.watch.relieve(self.id);
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            self.watch.owe(self.id);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<G> Drop for Watched<G> {
    fn drop(&mut self) {
        self.watch.relieve(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pool_closes_its_oldest_connection() {
        let pool = Unauthenticated::new(2);
        let a = pool.admit();
        let b = pool.admit();
        assert!(!a.closed().is_cancelled());
        let c = pool.admit();
        assert!(a.closed().is_cancelled());
        assert!(!b.closed().is_cancelled());
        assert_eq!(pool.waiting(), 2);
        // An admitted connection gives its place back.
        let admission = Admission::waiting(Some(b));
        admission.admitted();
        assert_eq!(pool.waiting(), 1);
        let _d = pool.admit();
        assert!(!c.closed().is_cancelled());
    }

    #[test]
    fn quotas_hold_per_node_and_per_namespace() {
        let q = Quota::new(3, 2);
        let a1 = q.try_take("a").unwrap();
        let _a2 = q.try_take("a").unwrap();
        assert_eq!(q.try_take("a").unwrap_err(), Full::Namespace);
        let _b1 = q.try_take("b").unwrap();
        assert_eq!(q.try_take("c").unwrap_err(), Full::Node);
        drop(a1);
        let _c1 = q.try_take("c").unwrap();
        assert!(q.held.lock().unwrap().by_namespace.len() == 3);
    }

    #[tokio::test]
    async fn a_write_the_client_never_takes_fails_after_the_deadline() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        // A pipe of 16 bytes.
        let (mut reader, writer) = tokio::io::duplex(16);
        let mut w = WriteDeadline::new(writer, Duration::from_millis(300));
        // Writes the reader takes in time go through, slow as they are.
        let slow = async {
            let mut buf = [0; 8];
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                reader.read_exact(&mut buf).await.unwrap();
            }
        };
        let (written, ()) = tokio::join!(w.write_all(&[0; 48]), slow);
        written.unwrap();
        // Now no one reads.
        let started = Instant::now();
        let err = w.write_all(&[0; 1]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[tokio::test]
    async fn a_body_owed_a_poll_stalls_its_connection_unless_something_moves() {
        let timeout = Duration::from_millis(300);
        let watch = WriteWatch::new();
        // No body: nothing stalls.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), watch.stalled(timeout))
                .await
                .is_err()
        );
        // A body the connection never polls stalls it after the deadline.
        let body = Watched::new(axum::body::Body::from("x"), watch.clone(), ());
        let started = Instant::now();
        watch.stalled(timeout).await;
        assert!(started.elapsed() >= timeout);
        // Bytes the client takes meanwhile (HTTP/1.1) keep it going.
        watch.progressed();
        let moving = async {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                watch.progressed();
            }
        };
        tokio::select! {
            () = watch.stalled(timeout) => panic!("stalled while bytes moved"),
            () = moving => {}
        }
        // Once polled to its end, the body owes nothing.
        let mut body = std::pin::pin!(body);
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        assert!(frame.is_some());
        let end = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        assert!(end.is_none());
        assert!(
            tokio::time::timeout(Duration::from_millis(500), watch.stalled(timeout))
                .await
                .is_err()
        );
    }
}
