//! Makes the `:authority` of HTTP/2 requests acceptable to the gRPC server.
//!
//! gRPC clients in Go that dial a bare socket path (as the upstream node
//! suite's pod resources client and many device plugins do) send that path,
//! `/var/lib/kubelet/pod-resources/kubelet.sock`, as the request's
//! `:authority`. The HTTP/2 server under tonic refuses such a request with
//! `PROTOCOL_ERROR` (hyperium/h2#487); the kubelet's Go server takes it.
//! [`Rewriter`] sits on the bytes a client sends before the server reads
//! them: it passes every frame through untouched but the header blocks
//! (HEADERS and CONTINUATION), which it decodes (HPACK), gives `localhost` as
//! the authority when theirs is not a valid URI authority, and encodes again.
//! The server's replies are not touched. [`FixAuthority`] applies it to a stream.
//! Blocks are encoded again with the rewriter's own indexing: a field the
//! client marked never-indexed loses that mark, which only matters to
//! intermediaries that pass blocks on further; this one hands them to the
//! server in the same process.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client sends first on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
/// A frame header's length.
const FRAME_HEADER_LEN: usize = 9;
/// The largest frame the server accepts (RFC 9113's initial
/// `SETTINGS_MAX_FRAME_SIZE`, which the server does not raise): header blocks
/// are sent again in frames of at most this.
const MAX_FRAME: usize = 16 * 1024;
/// The most bytes of one header block (all its frames' fragments) and of its
/// decoded header list (names, values and 32 bytes an entry, as RFC 9113
/// counts it) that are taken; a bigger one closes the connection. gRPC
/// requests carry a few hundred bytes.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// How much rewritten output one [`Rewriter::feed`] makes before it stops
/// taking input: a header block re-encoded can be much larger than the
/// client's (a one-byte reference to a long indexed field becomes the whole
/// field), so the input a read brings is taken a bounded piece at a time.
pub const MAX_OUT: usize = 256 * 1024;
/// The dynamic table size the server allows (HPACK's default, which the
/// server does not change).
const TABLE_SIZE: usize = 4096;
/// What replaces an authority that is not one.
const LOCALHOST: &[u8] = b"localhost";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Why a client's bytes were refused (the connection is then closed, as the
/// server would close it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A header block, or its decoded list, is over [`MAX_HEADER_BLOCK`].
    #[error("header block over {MAX_HEADER_BLOCK} bytes")]
    TooLarge,
    /// A header frame's padding or priority is longer than the frame, a
    /// CONTINUATION comes without a HEADERS before it, or another frame
    /// comes between them.
    #[error("malformed header frame")]
    Malformed,
    /// The header block does not decode.
    #[error("header block does not decode: {0}")]
    Hpack(String),
}

/// A header block being gathered from HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    /// END_STREAM and PRIORITY of the HEADERS frame.
    flags: u8,
    /// The HEADERS frame's priority fields (5 bytes, or none).
    priority: Vec<u8>,
    fragment: Vec<u8>,
}

/// Where the client's byte stream is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum At {
    /// In the connection preface, with this many of its bytes still to come.
    Preface(usize),
    /// At a frame header, or within a header frame (both gathered in `pending`).
    Frame,
    /// Within another frame's payload, with this many bytes of it to pass on.
    Payload(usize),
}

/// Rewrites invalid `:authority` values in the HTTP/2 bytes a client sends
/// (see the module's doc). Holds at most one header block, bounded by
/// [`MAX_HEADER_BLOCK`]; other frames pass through without being held.
pub struct Rewriter {
    at: At,
    /// The bytes of a frame header, or of a whole header frame, gathered so far.
    pending: Vec<u8>,
    block: Option<Block>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            at: At::Preface(PREFACE_LEN),
            pending: Vec::new(),
            block: None,
            decoder,
            encoder: Encoder::new(),
        }
    }
}

impl Rewriter {
    /// Takes the next bytes the client sent and appends what the server is
    /// to read to `out`: the same bytes but for header blocks, which come out
    /// once whole. Stops taking input once `out` holds [`MAX_OUT`] bytes (or
    /// a block more); returns how many bytes of `input` it took, the rest to
    /// be fed again once `out` is read.
    ///
    /// # Errors
    /// [`Error`]: the connection cannot go on.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        let whole = input.len();
        let mut input = input;
        while !input.is_empty() && out.len() < MAX_OUT {
            match self.at {
                At::Preface(left) | At::Payload(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.at = match (self.at, left - n) {
                        (_, 0) => At::Frame,
                        (At::Preface(_), rest) => At::Preface(rest),
                        (_, rest) => At::Payload(rest),
                    };
                }
                At::Frame => {
                    let want = match frame_header(&self.pending) {
                        None => FRAME_HEADER_LEN,
                        Some((len, kind, ..)) if is_header_frame(kind) => {
                            FRAME_HEADER_LEN.saturating_add(len)
                        }
                        Some(_) => FRAME_HEADER_LEN,
                    };
                    let n = want.saturating_sub(self.pending.len()).min(input.len());
                    self.pending.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.pending.len() == want {
                        self.frame(out)?;
                    }
                }
            }
        }
        Ok(whole - input.len())
    }

    /// Handles the frame header (or whole header frame) in `pending`.
    fn frame(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let Some((len, kind, flags, stream)) = frame_header(&self.pending) else {
            return Ok(());
        };
        if !is_header_frame(kind) {
            if self.block.is_some() {
                return Err(Error::Malformed);
            }
            out.append(&mut self.pending);
            self.at = if len == 0 {
                At::Frame
            } else {
                At::Payload(len)
            };
            return Ok(());
        }
        if len > MAX_HEADER_BLOCK {
            return Err(Error::TooLarge);
        }
        if self.pending.len() < FRAME_HEADER_LEN + len {
            // The header is read; the payload is gathered next.
            return Ok(());
        }
        let payload = self.pending.split_off(FRAME_HEADER_LEN);
        self.pending.clear();
        let fragment = if kind == HEADERS {
            if self.block.is_some() {
                return Err(Error::Malformed);
            }
            let (priority, fragment) = headers_payload(&payload, flags)?;
            self.block = Some(Block {
                stream,
                flags: flags & (END_STREAM | PRIORITY),
                priority: priority.to_vec(),
                fragment: Vec::new(),
            });
            fragment
        } else {
            if self.block.as_ref().is_none_or(|b| b.stream != stream) {
                return Err(Error::Malformed);
            }
            &payload[..]
        };
        let block = self.block.as_mut().ok_or(Error::Malformed)?;
        if block.fragment.len().saturating_add(fragment.len()) > MAX_HEADER_BLOCK {
            return Err(Error::TooLarge);
        }
        block.fragment.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            let block = self.block.take().ok_or(Error::Malformed)?;
            self.emit(&block, out)?;
        }
        Ok(())
    }

    /// Decodes a whole header block, mends its authority, and writes it out
    /// again in a HEADERS frame and as many CONTINUATION frames as it needs.
    fn emit(&mut self, block: &Block, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                size = size
                    .saturating_add(name.len())
                    .saturating_add(value.len())
                    .saturating_add(32);
                if size <= MAX_HEADER_BLOCK {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| Error::Hpack(format!("{e:?}")))?;
        if size > MAX_HEADER_BLOCK {
            return Err(Error::TooLarge);
        }
        for (name, value) in &mut headers {
            if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                *value = LOCALHOST.to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let first = MAX_FRAME - block.priority.len();
        let (head, mut rest) = encoded.split_at(first.min(encoded.len()));
        let last = if rest.is_empty() { END_HEADERS } else { 0 };
        let mut payload = block.priority.clone();
        payload.extend_from_slice(head);
        write_frame(out, HEADERS, block.flags | last, block.stream, &payload);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(MAX_FRAME.min(rest.len()));
            rest = tail;
            let last = if rest.is_empty() { END_HEADERS } else { 0 };
            write_frame(out, CONTINUATION, last, block.stream, chunk);
        }
        Ok(())
    }
}

fn is_header_frame(kind: u8) -> bool {
    kind == HEADERS || kind == CONTINUATION
}

/// A frame header's length, type, flags and stream, once its 9 bytes are in.
fn frame_header(b: &[u8]) -> Option<(usize, u8, u8, u32)> {
    let h: &[u8; FRAME_HEADER_LEN] = b.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    Some((len, h[3], h[4], stream))
}

/// A HEADERS payload's priority fields and block fragment, without padding.
fn headers_payload(p: &[u8], flags: u8) -> Result<(&[u8], &[u8]), Error> {
    let mut body = p;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body.split_first().ok_or(Error::Malformed)?;
        pad = usize::from(n);
        body = rest;
    }
    let body = body
        .len()
        .checked_sub(pad)
        .and_then(|end| body.get(..end))
        .ok_or(Error::Malformed)?;
    if flags & PRIORITY != 0 {
        return body.split_at_checked(5).ok_or(Error::Malformed);
    }
    Ok((&[], body))
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A server-side connection whose incoming bytes go through a [`Rewriter`];
/// writes go straight to the connection.
pub struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet read by the server, from `ready[at..]`.
    ready: Vec<u8>,
    at: usize,
    /// Bytes read from the client, `taken` of them fed to the rewriter.
    read: Box<[u8]>,
    filled: usize,
    taken: usize,
}

impl<S> FixAuthority<S> {
    /// Wraps the connection `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            at: 0,
            read: vec![0; MAX_FRAME].into_boxed_slice(),
            filled: 0,
            taken: 0,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.at);
                buf.put_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.taken == this.filled {
                let mut read = ReadBuf::new(&mut this.read);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                if read.filled().is_empty() {
                    return Poll::Ready(Ok(()));
                }
                (this.filled, this.taken) = (read.filled().len(), 0);
            }
            let took = this
                .rewriter
                .feed(&this.read[this.taken..this.filled], &mut this.ready)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            this.taken += took;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FixAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SOCKET: &[u8] = b"/var/lib/kubelet/pod-resources/kubelet.sock";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, kind, flags, stream, payload);
        out
    }

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/v1.PodResourcesLister/List"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    fn encode(enc: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        enc.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// Splits `out` into frames: (type, flags, stream, payload).
    fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut all = Vec::new();
        while let Some((len, kind, flags, stream)) = frame_header(out) {
            all.push((kind, flags, stream, out[9..9 + len].to_vec()));
            out = &out[9 + len..];
        }
        assert!(out.is_empty(), "a frame is cut");
        all
    }

    /// The header lists of the blocks in `frames`, decoded as the server would.
    fn header_lists(frames: &[(u8, u8, u32, Vec<u8>)]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut dec = Decoder::new();
        let mut lists = Vec::new();
        let mut block = Vec::new();
        for (kind, flags, _, payload) in frames {
            if is_header_frame(*kind) {
                let (_, fragment) = if *kind == HEADERS {
                    headers_payload(payload, *flags).unwrap()
                } else {
                    (&[][..], &payload[..])
                };
                block.extend_from_slice(fragment);
                if flags & END_HEADERS != 0 {
                    lists.push(dec.decode(&block).unwrap());
                    block.clear();
                }
            }
        }
        lists
    }

    fn authority(list: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
        &list.iter().find(|(n, _)| n == b":authority").unwrap().1
    }

    fn rewrite(input: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let mut rw = Rewriter::default();
        let mut at = 0;
        while at < input.len() {
            at += rw.feed(&input[at..], &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn a_socket_path_as_authority_becomes_localhost_and_the_rest_passes_unchanged() {
        let mut enc = Encoder::new();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\x05hello");
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut enc, &request(SOCKET)),
        ));
        input.extend(&data);
        // The client's encoder indexed the path: the second request refers to it.
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &encode(&mut enc, &request(SOCKET)),
        ));
        let out = rewrite(&input).unwrap();
        assert!(out.starts_with(PREFACE));
        let all = frames(&out[PREFACE.len()..]);
        assert_eq!(all.len(), 4);
        assert_eq!(
            all[0],
            (0x4, 0, 0, settings[9..].to_vec()),
            "SETTINGS untouched"
        );
        assert_eq!(
            all[2],
            (0x0, END_STREAM, 1, data[9..].to_vec()),
            "DATA untouched"
        );
        assert_eq!((all[1].0, all[1].1, all[1].2), (HEADERS, END_HEADERS, 1));
        assert_eq!(
            (all[3].0, all[3].1, all[3].2),
            (HEADERS, END_HEADERS | END_STREAM, 3)
        );
        let lists = header_lists(&all);
        for list in &lists {
            assert_eq!(authority(list), b"localhost");
            let mut want = request(b"localhost");
            want.retain(|h| h.0 != b":authority");
            let mut got = list.clone();
            got.retain(|h| h.0 != b":authority");
            assert_eq!(got, want, "every other header as sent, in order");
        }
    }

    #[test]
    fn a_valid_authority_is_kept() {
        let mut enc = Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut enc, &request(b"localhost:1234")),
        ));
        let out = rewrite(&input).unwrap();
        let lists = header_lists(&frames(&out[PREFACE.len()..]));
        assert_eq!(authority(&lists[0]), b"localhost:1234");
        for bad in [&b""[..], b"unix:///run/x.sock", b"%2Frun%2Fx.sock", b"a b"] {
            let mut input = PREFACE.to_vec();
            input.extend(frame(
                HEADERS,
                END_HEADERS,
                1,
                &encode(&mut Encoder::new(), &request(bad)),
            ));
            let out = rewrite(&input).unwrap();
            let lists = header_lists(&frames(&out[PREFACE.len()..]));
            assert_eq!(authority(&lists[0]), b"localhost", "{bad:?}");
        }
    }

    #[test]
    fn padding_priority_and_continuations_are_read_and_the_block_sent_whole() {
        let block = encode(&mut Encoder::new(), &request(SOCKET));
        let (a, b) = block.split_at(10);
        let mut payload = vec![3u8]; // pad length
        payload.extend([0x80, 0, 0, 1, 15]); // exclusive dependency on 1, weight 16
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        // Fed a byte at a time, as a slow client would send it.
        let mut rw = Rewriter::default();
        let mut out = Vec::new();
        for byte in &input {
            rw.feed(std::slice::from_ref(byte), &mut out).unwrap();
        }
        assert_eq!(out, rewrite(&input).unwrap());
        let all = frames(&out[PREFACE.len()..]);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1, PRIORITY | END_STREAM | END_HEADERS);
        assert_eq!(&all[0].3[..5], &[0x80, 0, 0, 1, 15], "priority kept");
        assert_eq!(authority(&header_lists(&all)[0]), b"localhost");
    }

    #[test]
    fn a_block_over_one_frame_goes_out_in_continuations() {
        let mut headers = request(SOCKET);
        headers.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
        let block = encode(&mut Encoder::new(), &headers);
        let mut input = PREFACE.to_vec();
        for (i, chunk) in block.chunks(MAX_FRAME).enumerate() {
            let last = (i + 1) * MAX_FRAME >= block.len();
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 1, chunk));
        }
        let all = frames(&rewrite(&input).unwrap()[PREFACE.len()..]);
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!(
            all.iter().map(|f| f.1 & END_HEADERS).collect::<Vec<_>>(),
            [0, 0, END_HEADERS]
        );
        let lists = header_lists(&all);
        assert_eq!(authority(&lists[0]), b"localhost");
        assert_eq!(lists[0].last().unwrap().1.len(), 40_000);
    }

    #[test]
    fn a_read_that_expands_is_taken_a_bounded_piece_at_a_time() {
        // A literal with incremental indexing of a new name (RFC 7541 6.2.1).
        let indexed = |name: &[u8], value: &[u8]| {
            let mut b = vec![0x40];
            for s in [name, value] {
                b.extend(loona_hpack::encoder::encode_integer(s.len(), 7));
                b.extend(s);
            }
            b
        };
        let mut input = Vec::new();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &indexed(b"x-a", &[b'a'; 4000]),
        ));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &indexed(b"x-a", &[b'b'; 4000]),
        ));
        // 600 frames of 16 one-byte references to the newest entry: about
        // 15 KiB in, and each block about 64 KiB out once re-encoded.
        for i in 0..600u32 {
            input.extend(frame(HEADERS, END_HEADERS, 5 + 2 * i, &[0x80 | 62; 16]));
        }
        let mut rw = Rewriter::default();
        let (mut out, mut at, mut most, mut blocks) = (Vec::new(), 0, 0, 0);
        assert_eq!(rw.feed(PREFACE, &mut out), Ok(PREFACE.len()));
        out.clear();
        while at < input.len() {
            at += rw.feed(&input[at..], &mut out).unwrap();
            most = most.max(out.len());
            blocks += frames(&out).iter().filter(|f| f.0 == HEADERS).count();
            out.clear();
        }
        assert_eq!(blocks, 602, "every block came out");
        assert!(
            most <= MAX_OUT + MAX_HEADER_BLOCK + 1024,
            "held {most} bytes at once"
        );
    }

    #[test]
    fn hostile_header_frames_close_the_connection_holding_little() {
        let too_long = |len: usize| {
            let mut f = PREFACE.to_vec();
            f.extend(&(u32::try_from(len).unwrap().to_be_bytes()[1..]));
            f.extend([HEADERS, 0, 0, 0, 0, 1]);
            f
        };
        // A frame that claims 16 MiB is refused at its header, before any payload.
        assert_eq!(rewrite(&too_long((1 << 24) - 1)), Err(Error::TooLarge));
        // Continuations that never end: refused past the bound.
        let mut rw = Rewriter::default();
        let mut out = Vec::new();
        rw.feed(PREFACE, &mut out).unwrap();
        rw.feed(&frame(HEADERS, 0, 1, &[0x82; 1000]), &mut out)
            .unwrap();
        let cont = frame(CONTINUATION, 0, 1, &vec![0x82; MAX_FRAME]);
        let refused = (0..10).find_map(|_| rw.feed(&cont, &mut out).err());
        assert_eq!(refused, Some(Error::TooLarge));
        assert_eq!(out, PREFACE, "nothing of the block went out");
        // A small block of indexed fields that expands past the bound: one
        // 4000-byte entry, then 64 references to it.
        let mut enc = Encoder::new();
        let mut block = encode(&mut enc, &[(b"x-a".to_vec(), vec![b'a'; 4000])]);
        let again = encode(&mut enc, &[(b"x-a".to_vec(), vec![b'a'; 4000])]);
        for _ in 0..64 {
            block.extend(&again);
        }
        assert!(block.len() < 5000);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        assert_eq!(rewrite(&input), Err(Error::TooLarge));
        // Malformed: padding longer than the frame, a CONTINUATION alone,
        // another frame inside a block, a table size over the server's.
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 0x82]));
        assert_eq!(rewrite(&input), Err(Error::Malformed));
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
        assert_eq!(rewrite(&input), Err(Error::Malformed));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert_eq!(rewrite(&input), Err(Error::Malformed));
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0x3f, 0xe1, 0xff, 0x03, 0x82],
        ));
        assert!(matches!(rewrite(&input), Err(Error::Hpack(_))));
    }
}
