//! The load workers' own HTTP/1.1 client.

use super::*;
use anyhow::{anyhow, bail, Context};
use bytes::{Buf, Bytes, BytesMut};
use hyper::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

// The load workers' HTTP/1.1 client, written on the TLS stream: hyper's client (a connection task fed
// through channels, a `Request` and header map built per call) costs tens of µs of CPU per request, taken
// from the server under test when both share the machine. Here a request is serialized into a reused
// buffer and written at once, and its answer read into another reused buffer and parsed in place.

/// Largest response head accepted (status line and headers), and largest chunk-size or trailer line.
pub(super) const MAX_HEAD: usize = 64 * 1024;
pub(super) const MAX_LINE: usize = 4096;
/// Room made in the read buffer before each read when the answer's size is not known yet: a whole TLS record.
pub(super) const READ_ROOM: usize = 16 * 1024;

/// One keep-alive HTTP/1.1 connection of a load worker, one request at a time.
pub(super) struct LeanConn {
    pub(super) tls: TlsStream<TcpStream>,
    /// The Host header, `host: <authority>\r\n`, and a token user's Authorization header: sent with every request.
    pub(super) host: Vec<u8>,
    /// The request being written.
    pub(super) out: Vec<u8>,
    /// Bytes read and not parsed yet.
    pub(super) input: BytesMut,
    pub(super) parser: ResponseParser,
    /// The server closes the connection after the last answer (`Connection: close`, or a body until EOF):
    /// the caller must not reuse it.
    pub(super) closed: bool,
    /// The Retry-After header of the last answer, when it had one.
    pub(super) retry_after: Option<String>,
}

impl LeanConn {
    pub(super) fn new(tls: TlsStream<TcpStream>, authority: &str, authorization: Option<&str>) -> LeanConn {
        let mut host = format!("host: {authority}\r\n");
        if let Some(authorization) = authorization {
            host += &format!("authorization: {authorization}\r\n");
        }
        LeanConn {
            tls,
            host: host.into_bytes(),
            out: Vec::with_capacity(4096),
            input: BytesMut::with_capacity(READ_ROOM),
            parser: ResponseParser::default(),
            closed: false,
            retry_after: None,
        }
    }

    /// One request and its whole answer, within [`REQUEST_TIMEOUT`] (as [`Conn::call`]). After an error the
    /// connection is in an unknown state and must be dropped.
    pub(super) async fn call(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(req))
            .await
            .map_err(|_| anyhow!("{} {}: no answer within {REQUEST_TIMEOUT:?}", req.method, req.path))?
    }

    pub(super) async fn exchange(&mut self, req: &Req) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        anyhow::ensure!(!self.closed, "the server closed the connection");
        write_request(&mut self.out, &self.host, req);
        self.tls.write_all(&self.out).await?;
        self.tls.flush().await?;
        self.parser.start(req.method == Method::HEAD);
        loop {
            if let Some(answer) = self.parser.advance(&mut self.input)? {
                (self.closed, self.retry_after) = (answer.close, answer.retry_after);
                return Ok((answer.status, answer.body));
            }
            self.input.reserve(self.parser.missing(self.input.len()).max(READ_ROOM));
            if self.tls.read_buf(&mut self.input).await? == 0 {
                let answer = self.parser.at_eof(&mut self.input)?;
                (self.closed, self.retry_after) = (true, answer.retry_after);
                return Ok((answer.status, answer.body));
            }
        }
    }
}

/// Serializes `req` into `out` (cleared first): request line, the headers [`Conn::send`] sends through
/// hyper (Host and a token user's Authorization, both in `host`; Accept, Content-Type when set) and the
/// Content-Length of the body, then the body.
pub(super) fn write_request(out: &mut Vec<u8>, host: &[u8], req: &Req) {
    use std::io::Write;
    debug_assert!(!req.path.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()), "{}", req.path);
    out.clear();
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    out.extend_from_slice(host);
    out.extend_from_slice(b"accept: ");
    out.extend_from_slice(req.accept.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(ct) = req.content_type {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(ct.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !req.body.is_empty() || [Method::POST, Method::PUT, Method::PATCH].contains(&req.method) {
        let _ = write!(out, "content-length: {}\r\n", req.body.len());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
}

/// A complete answer.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: hyper::StatusCode,
    pub(super) body: Bytes,
    /// The server closes the connection after this answer.
    pub(super) close: bool,
    /// Its Retry-After header, trimmed.
    pub(super) retry_after: Option<String>,
}

/// Incremental parser of the answers of one connection: fed by [`ResponseParser::advance`] with the bytes
/// read so far, it consumes what it has parsed and leaves what follows the answer (the next one) in place.
#[derive(Default)]
pub(super) struct ResponseParser {
    pub(super) stage: Stage,
    /// The request was a HEAD: no body whatever the headers say.
    pub(super) head_request: bool,
    pub(super) status: Option<hyper::StatusCode>,
    pub(super) close: bool,
    pub(super) retry_after: Option<String>,
    /// The body of a chunked answer, put together (kept to reuse its memory).
    pub(super) chunks: BytesMut,
}

#[derive(Default, Debug, PartialEq)]
pub(super) enum Stage {
    #[default]
    Head,
    /// A body of this many bytes (`Content-Length`).
    Length(usize),
    /// A chunked body: expecting a chunk-size line.
    ChunkSize,
    /// This many bytes of the current chunk to go, then its CRLF.
    ChunkData(usize),
    ChunkEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
    /// A body until the server closes the connection.
    UntilEof,
}

impl ResponseParser {
    /// Expects the answer to a new request.
    pub(super) fn start(&mut self, head_request: bool) {
        (self.stage, self.head_request, self.status, self.close) = (Stage::Head, head_request, None, false);
        self.retry_after = None;
        self.chunks.clear();
    }

    /// Bytes still needed beyond the `buffered` ones when that is known (a body), else 0.
    pub(super) fn missing(&self, buffered: usize) -> usize {
        match self.stage {
            Stage::Length(n) | Stage::ChunkData(n) => n.saturating_sub(buffered),
            _ => 0,
        }
    }

    pub(super) fn answer(&mut self, body: Bytes) -> anyhow::Result<Answer> {
        let status = self.status.take().context("no status")?;
        self.stage = Stage::Head;
        Ok(Answer { status, body, close: self.close, retry_after: self.retry_after.take() })
    }

    /// Parses from `buf`, consuming what it parsed: the complete answer, or `None` when more bytes are needed.
    pub(super) fn advance(&mut self, buf: &mut BytesMut) -> anyhow::Result<Option<Answer>> {
        loop {
            match self.stage {
                Stage::Head => {
                    if !self.head(buf)? {
                        return Ok(None);
                    }
                }
                Stage::Length(n) => {
                    if buf.len() < n {
                        return Ok(None);
                    }
                    let body = buf.split_to(n).freeze();
                    return self.answer(body).map(Some);
                }
                Stage::ChunkSize => {
                    if !buf.first().is_none_or(u8::is_ascii_hexdigit) {
                        bail!("bad chunk size line {:?}", String::from_utf8_lossy(&buf[..buf.len().min(40)]));
                    }
                    match httparse::parse_chunk_size(buf) {
                        Ok(httparse::Status::Complete((used, size))) => {
                            buf.advance(used);
                            let size = usize::try_from(size).context("chunk too large")?;
                            self.stage = if size == 0 { Stage::Trailers } else { Stage::ChunkData(size) };
                        }
                        Ok(httparse::Status::Partial) if buf.len() < MAX_LINE => return Ok(None),
                        _ => bail!("bad chunk size line {:?}", String::from_utf8_lossy(&buf[..buf.len().min(40)])),
                    }
                }
                Stage::ChunkData(n) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = n.min(buf.len());
                    self.chunks.extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    self.stage = if take == n { Stage::ChunkEnd } else { Stage::ChunkData(n - take) };
                }
                Stage::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    anyhow::ensure!(&buf[..2] == b"\r\n", "chunk data not followed by CRLF");
                    buf.advance(2);
                    self.stage = Stage::ChunkSize;
                }
                Stage::Trailers => {
                    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                        anyhow::ensure!(buf.len() < MAX_LINE, "trailer line too long");
                        return Ok(None);
                    };
                    let empty = nl == 0 || (nl == 1 && buf[0] == b'\r');
                    buf.advance(nl + 1);
                    if empty {
                        let body = self.chunks.split().freeze();
                        return self.answer(body).map(Some);
                    }
                }
                Stage::UntilEof => return Ok(None),
            }
        }
    }

    /// The connection reached EOF with `buf` left: completes an answer whose body ends there, else an error.
    pub(super) fn at_eof(&mut self, buf: &mut BytesMut) -> anyhow::Result<Answer> {
        match self.stage {
            Stage::UntilEof => {
                let body = buf.split().freeze();
                self.answer(body)
            }
            Stage::Head if buf.is_empty() => bail!("the server closed the connection"),
            _ => bail!("the server closed the connection in the middle of an answer"),
        }
    }

    /// Parses the status line and headers when complete: consumes them and picks how the body is framed.
    /// Interim (1xx) answers are skipped.
    pub(super) fn head(&mut self, buf: &mut BytesMut) -> anyhow::Result<bool> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let used = match resp.parse(buf) {
            Ok(httparse::Status::Complete(used)) => used,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(false),
            Ok(httparse::Status::Partial) => bail!("response head larger than {MAX_HEAD} bytes"),
            Err(e) => bail!("bad response head ({e}): {:?}", String::from_utf8_lossy(&buf[..buf.len().min(200)])),
        };
        let code = resp.code.context("no status code")?;
        let status = hyper::StatusCode::from_u16(code).with_context(|| format!("bad status {code}"))?;
        let (mut length, mut chunked, mut encoded, mut close, mut keep_alive) = (None, false, false, false, false);
        let mut retry_after = None;
        for h in resp.headers.iter() {
            let value = || std::str::from_utf8(h.value).unwrap_or("").split(',').map(str::trim);
            if h.name.eq_ignore_ascii_case("content-length") {
                let n: usize = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .with_context(|| format!("bad Content-Length {:?}", String::from_utf8_lossy(h.value)))?;
                anyhow::ensure!(length.is_none_or(|l| l == n), "conflicting Content-Length headers");
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // The last coding applied says whether the body is chunked.
                encoded = true;
                chunked = value().next_back().is_some_and(|c| c.eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                close |= value().any(|t| t.eq_ignore_ascii_case("close"));
                keep_alive |= value().any(|t| t.eq_ignore_ascii_case("keep-alive"));
            } else if h.name.eq_ignore_ascii_case("retry-after") {
                retry_after = Some(String::from_utf8_lossy(h.value).trim().to_string());
            }
        }
        let http10 = resp.version == Some(0);
        buf.advance(used);
        if status.is_informational() {
            anyhow::ensure!(status != hyper::StatusCode::SWITCHING_PROTOCOLS, "unexpected 101 Switching Protocols");
            return Ok(true); // the real answer follows
        }
        self.status = Some(status);
        self.retry_after = retry_after;
        self.close = close || (http10 && !keep_alive);
        self.stage = if self.head_request
            || status == hyper::StatusCode::NO_CONTENT
            || status == hyper::StatusCode::NOT_MODIFIED
        {
            Stage::Length(0)
        } else if chunked {
            Stage::ChunkSize
        } else if let (false, Some(n)) = (encoded, length) {
            Stage::Length(n)
        } else {
            self.close = true;
            Stage::UntilEof
        };
        Ok(true)
    }
}
