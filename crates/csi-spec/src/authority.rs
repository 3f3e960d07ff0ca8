//! Accept what grpc clients send as `:authority` over a unix socket.
//!
//! Why this exists: the kubelet v1.26 dials plugin-registration sockets by path, so grpc-go puts
//! the socket path (`/var/lib/kubelet/plugins_registry/x-reg.sock`) into the HTTP/2 `:authority`
//! pseudo-header; grpc-core clients (Python's grpcio) send the percent-encoded path, and
//! grpc-java sends the path too. None of these is a valid URI authority, and h2 — the HTTP/2
//! server under tonic — refuses such a request with `RST_STREAM(PROTOCOL_ERROR)` before any of
//! our code runs (the kubelet logs `RegisterPlugin error -- failed to get plugin info using RPC
//! GetInfo ... PROTOCOL_ERROR` forever). Kubernetes itself switched its clients to `localhost`
//! only later (v1.27), and every grpc-go based CO or sidecar a user runs may still send a path.
//!
//! A unix socket has no authority to check, so the server side may treat any of these as
//! `localhost`. [`AuthorityFix`] wraps an accepted connection and rewrites the client-to-server
//! byte stream: every header block is HPACK-decoded (with the client's compression context),
//! an invalid `:authority` is replaced by `localhost`, and the block is re-encoded with a
//! context of our own that the server's decoder then follows. Everything else — DATA, SETTINGS,
//! PING, WINDOW_UPDATE, RST_STREAM, GOAWAY, PRIORITY, and the whole server-to-client direction —
//! passes through byte for byte. A connection that does not open with the HTTP/2 preface is
//! passed through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Every HTTP/2 peer accepts frames of this size (the protocol's minimum SETTINGS_MAX_FRAME_SIZE),
/// so re-encoded header blocks are split at it whatever the server advertised.
const MAX_EMITTED_FRAME: usize = 16_384;
/// A header block (HEADERS + CONTINUATIONs) larger than this is refused: h2's own default limit
/// on a decoded header list is 16 KiB, so nothing legitimate comes near it.
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// What a unix-socket client's authority means.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// A server-side connection whose client-sent `:authority` is made acceptable to h2.
/// See the module docs.
#[derive(Debug)]
pub struct AuthorityFix<T> {
    inner: T,
    rewriter: Rewriter,
    /// Bytes read from the client, not yet processed (an incomplete frame).
    raw: Vec<u8>,
    /// Processed bytes not yet handed to the server.
    ready: Vec<u8>,
    ready_pos: usize,
    eof: bool,
}

impl<T> AuthorityFix<T> {
    /// Wraps an accepted connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            raw: Vec::new(),
            ready: Vec::new(),
            ready_pos: 0,
            eof: false,
        }
    }

    /// How many `:authority` values this connection had rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.rewriter.rewritten
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AuthorityFix<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_pos < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_pos);
                buf.put_slice(&this.ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    this.ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A partial frame left at EOF is dropped: h2 sees the connection end, as it
                // would have mid-frame anyway.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut chunk_buf = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk_buf))?;
            let filled = chunk_buf.filled();
            if filled.is_empty() {
                this.eof = true;
                continue;
            }
            this.raw.extend_from_slice(filled);
            this.rewriter.process(&mut this.raw, &mut this.ready)?;
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<T> {
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

impl<T: Connected> Connected for AuthorityFix<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Matching the client preface; `usize` bytes of it seen so far.
    #[default]
    Preface,
    Frames,
    /// Not HTTP/2 with prior knowledge: hands everything on untouched.
    Passthrough,
}

/// A header block being collected across HEADERS + CONTINUATION frames.
#[derive(Debug)]
struct PendingBlock {
    stream_id: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The byte-stream transformation, apart from I/O so it can be tested on byte strings.
#[derive(Default)]
struct Rewriter {
    phase: Phase,
    preface_seen: usize,
    /// The client's compression context, as the client's encoder built it.
    decoder: loona_hpack::Decoder<'static>,
    /// Ours, which the server's decoder follows.
    encoder: loona_hpack::Encoder<'static>,
    pending: Option<PendingBlock>,
    rewritten: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("phase", &self.phase)
            .field("rewritten", &self.rewritten)
            .finish_non_exhaustive()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Rewriter {
    /// Moves every complete unit of `raw` (preface bytes, whole frames) to `out`, rewritten;
    /// leaves an incomplete frame in `raw`.
    fn process(&mut self, raw: &mut Vec<u8>, out: &mut Vec<u8>) -> io::Result<()> {
        let mut pos = 0;
        if self.phase == Phase::Preface {
            let want = &PREFACE[self.preface_seen..];
            let n = want.len().min(raw.len());
            if raw[..n] == want[..n] {
                self.preface_seen += n;
                pos = n;
                if self.preface_seen == PREFACE.len() {
                    self.phase = Phase::Frames;
                }
            } else {
                self.phase = Phase::Passthrough;
                // The matched part of the preface was held back: hand it on first.
                out.extend_from_slice(&PREFACE[..self.preface_seen]);
            }
            out.extend_from_slice(&raw[..pos]);
        }
        if self.phase == Phase::Passthrough {
            out.extend_from_slice(&raw[pos..]);
            raw.clear();
            return Ok(());
        }
        while self.phase == Phase::Frames && raw.len() - pos >= FRAME_HEADER_LEN {
            let header = &raw[pos..pos + FRAME_HEADER_LEN];
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            if raw.len() - pos < FRAME_HEADER_LEN + len {
                break;
            }
            let kind = header[3];
            let flags = header[4];
            let stream_id =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let payload = &raw[pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + len];
            match kind {
                TYPE_HEADERS => self.headers(stream_id, flags, payload, out)?,
                TYPE_CONTINUATION => self.continuation(stream_id, flags, payload, out)?,
                _ if self.pending.is_some() => {
                    return Err(invalid(format!(
                        "HTTP/2 frame of type {kind:#x} in the middle of a header block"
                    )));
                }
                _ => out.extend_from_slice(&raw[pos..pos + FRAME_HEADER_LEN + len]),
            }
            pos += FRAME_HEADER_LEN + len;
        }
        raw.drain(..pos);
        Ok(())
    }

    fn headers(
        &mut self,
        stream_id: u32,
        flags: u8,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        if self.pending.is_some() {
            return Err(invalid(
                "HEADERS frame in the middle of a header block".into(),
            ));
        }
        let mut body = payload;
        let mut pad = 0;
        if flags & FLAG_PADDED != 0 {
            let (&n, rest) = body
                .split_first()
                .ok_or_else(|| invalid("padded HEADERS frame without its pad length".into()))?;
            pad = usize::from(n);
            body = rest;
        }
        let mut priority = None;
        if flags & FLAG_PRIORITY != 0 {
            let (p, rest) = body
                .split_first_chunk::<5>()
                .ok_or_else(|| invalid("HEADERS frame too short for its priority".into()))?;
            priority = Some(*p);
            body = rest;
        }
        let fragment = body
            .get(..body.len().saturating_sub(pad))
            .filter(|_| pad <= body.len())
            .ok_or_else(|| invalid("HEADERS frame padding longer than its payload".into()))?;
        self.pending = Some(PendingBlock {
            stream_id,
            flags,
            priority,
            fragment: fragment.to_vec(),
        });
        if flags & FLAG_END_HEADERS != 0 {
            self.finish_block(out)?;
        }
        Ok(())
    }

    fn continuation(
        &mut self,
        stream_id: u32,
        flags: u8,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let pending = self
            .pending
            .as_mut()
            .filter(|p| p.stream_id == stream_id)
            .ok_or_else(|| {
                invalid(format!(
                    "CONTINUATION frame on stream {stream_id} without its HEADERS"
                ))
            })?;
        if pending.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
            return Err(invalid(format!(
                "header block of stream {stream_id} larger than {MAX_HEADER_BLOCK} bytes"
            )));
        }
        pending.fragment.extend_from_slice(payload);
        if flags & FLAG_END_HEADERS != 0 {
            self.finish_block(out)?;
        }
        Ok(())
    }

    fn finish_block(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let Some(block) = self.pending.take() else {
            return Ok(());
        };
        let mut fields = self.decoder.decode(&block.fragment).map_err(|e| {
            invalid(format!(
                "HPACK header block of stream {} does not decode: {e:?}",
                block.stream_id
            ))
        })?;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !valid_authority(value) {
                tracing::debug!(
                    stream = block.stream_id,
                    authority = %String::from_utf8_lossy(value),
                    "client sent a :authority that is no URI authority (a socket path); serving it as localhost"
                );
                *value = LOCAL_AUTHORITY.to_vec();
                self.rewritten += 1;
            }
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        emit_block(&block, &encoded, out);
        Ok(())
    }
}

/// What h2 accepts as `:authority` (it parses it with the `http` crate).
fn valid_authority(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

/// Writes `encoded` as one HEADERS frame and as many CONTINUATION frames as it needs, keeping
/// END_STREAM and the priority of the original; no padding.
fn emit_block(block: &PendingBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let priority_len = if block.priority.is_some() { 5 } else { 0 };
    let first_room = MAX_EMITTED_FRAME - priority_len;
    let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
    let mut flags = block.flags & (FLAG_END_STREAM | FLAG_PRIORITY);
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        out,
        priority_len + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream_id,
    );
    if let Some(p) = block.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMITTED_FRAME));
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream_id);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    // `len` is at most MAX_EMITTED_FRAME, far below the 24-bit limit.
    let len = len.to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    /// Parses `bytes` (after the preface) into (type, flags, stream, payload) frames.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            v.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        v
    }

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    /// Runs `input` through a rewriter fed in `chunk`-byte pieces, then decodes every header
    /// block of the output as the server would.
    type Block = Vec<(Vec<u8>, Vec<u8>)>;

    fn run(input: &[u8], chunk: usize) -> (Vec<u8>, Vec<Block>, u64) {
        let mut rw = Rewriter::default();
        let mut raw = Vec::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            raw.extend_from_slice(piece);
            rw.process(&mut raw, &mut out).unwrap();
        }
        assert!(raw.is_empty(), "all input consumed");
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let mut server = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut pending = Vec::new();
        for (kind, flags, _, payload) in frames(&out[PREFACE.len()..]) {
            if kind == TYPE_HEADERS || kind == TYPE_CONTINUATION {
                let body = if kind == TYPE_HEADERS && flags & FLAG_PRIORITY != 0 {
                    &payload[5..]
                } else {
                    &payload[..]
                };
                pending.extend_from_slice(body);
                if flags & FLAG_END_HEADERS != 0 {
                    blocks.push(server.decode(&pending).unwrap());
                    pending.clear();
                }
            }
        }
        (out, blocks, rw.rewritten)
    }

    fn authority_of(block: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
        &block.iter().find(|(n, _)| n == b":authority").unwrap().1
    }

    #[test]
    fn socket_path_authority_becomes_localhost_across_requests_sharing_the_dynamic_table() {
        // A client encoder that indexes the path: the second request refers to it by index only.
        let mut client = loona_hpack::Encoder::new();
        let path = b"/var/lib/kubelet/plugins_registry/ebs.csi.aws.com-reg.sock";
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        for stream in [1, 3] {
            let req = request(path);
            let block = client.encode(req.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, &block));
            input.extend(frame(0x0, FLAG_END_STREAM, stream, b"\0\0\0\0\0"));
        }
        for chunk in [1, 7, 4096] {
            let (out, blocks, rewritten) = run(&input, chunk);
            assert_eq!(blocks.len(), 2);
            for b in &blocks {
                assert_eq!(authority_of(b), b"localhost");
                assert_eq!(b[2].1, b"/pluginregistration.Registration/GetInfo");
            }
            assert_eq!(rewritten, 2);
            // DATA frames are untouched.
            let data: Vec<_> = frames(&out[PREFACE.len()..])
                .into_iter()
                .filter(|f| f.0 == 0)
                .collect();
            assert_eq!(data.len(), 2);
            assert_eq!(data[1].3, b"\0\0\0\0\0");
            assert_eq!(data[1].1, FLAG_END_STREAM);
        }
    }

    #[test]
    fn valid_authority_is_kept_and_percent_encoded_paths_are_replaced() {
        assert!(valid_authority(b"localhost"));
        assert!(valid_authority(b"127.0.0.1:8080"));
        assert!(!valid_authority(b"/run/csi/csi.sock"));
        assert!(!valid_authority(b"%2Frun%2Fcsi%2Fcsi.sock"));
        let mut client = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        let req = request(b"localhost");
        let block = client.encode(req.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &block,
        ));
        let (out, blocks, rewritten) = run(&input, 3);
        assert_eq!(rewritten, 0);
        assert_eq!(authority_of(&blocks[0]), b"localhost");
        assert_eq!(
            frames(&out[PREFACE.len()..])[0].1,
            FLAG_END_HEADERS | FLAG_END_STREAM
        );
    }

    #[test]
    fn padding_priority_and_continuations_are_handled() {
        let mut client = loona_hpack::Encoder::new();
        let req = request(b"/tmp/x.sock");
        let block = client.encode(req.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            5,
            &payload,
        ));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, b));
        let (out, blocks, _) = run(&input, 2);
        assert_eq!(authority_of(&blocks[0]), b"localhost");
        let f = frames(&out[PREFACE.len()..]);
        assert_eq!(f.len(), 1, "one HEADERS frame, the block fits");
        assert_eq!(f[0].1, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(&f[0].3[..5], &[0, 0, 0, 0, 16]);
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let mut client = loona_hpack::Encoder::new();
        let mut req = request(b"/tmp/x.sock");
        req.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = client.encode(req.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut input = PREFACE.to_vec();
        let (a, b) = block.split_at(16_000);
        input.extend(frame(TYPE_HEADERS, 0, 1, a));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
        let (out, blocks, _) = run(&input, 5000);
        let f = frames(&out[PREFACE.len()..]);
        assert_eq!(f.len(), 3);
        assert!(f.iter().all(|fr| fr.3.len() <= MAX_EMITTED_FRAME));
        assert_eq!(f[0].0, TYPE_HEADERS);
        assert_eq!(f[2].1, FLAG_END_HEADERS);
        assert_eq!(blocks[0].last().unwrap().1.len(), 40_000);
        assert_eq!(authority_of(&blocks[0]), b"localhost");
    }

    #[test]
    fn non_http2_input_passes_through_and_protocol_errors_are_errors() {
        let (mut raw, mut out) = (b"PRI * HTTP/1.1 whatever".to_vec(), Vec::new());
        let mut rw = Rewriter::default();
        rw.process(&mut raw, &mut out).unwrap();
        assert_eq!(out, b"PRI * HTTP/1.1 whatever");

        let mut rw = Rewriter::default();
        let mut raw = PREFACE.to_vec();
        raw.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b"\x82"));
        let err = rw.process(&mut raw, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("without its HEADERS"), "{err}");

        let mut rw = Rewriter::default();
        let mut raw = PREFACE.to_vec();
        raw.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            b"\xff\xff\xff\xff",
        ));
        let err = rw.process(&mut raw, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("does not decode"), "{err}");
    }
}
