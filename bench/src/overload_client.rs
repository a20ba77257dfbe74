//! The token user of the overload rows ([`super::overload_limit`]), as client-go behaves: each connection kept
//! alive and sending one unpaginated LIST after another, a 429 followed by a wait of its Retry-After (client-go
//! retries a 429 after Retry-After, up to 10 times). Every answer is read to its end and the objects of a LIST
//! counted as its bytes arrive, never held whole: without a limit 256 answers of 8 MiB stream at once. So these
//! connections are hyper's client `conn`, its body read frame by frame ([`LeanConn`] puts an answer together).

use super::*;
use anyhow::Context;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One answer read to its end: a LIST started before the window's end is read however long it takes, up to this.
const ANSWER_LIMIT: Duration = Duration::from_secs(300);
/// client-go's retries of a 429 before it returns the 429 to its caller: a run of one more 429s in a row.
const CLIENT_GO_RETRIES: u64 = 10;

/// What the token user's connections got.
#[derive(Default)]
pub(super) struct ListLoad {
    /// Latencies of the LISTs answered whole, every object counted (µs; sorted by [`token_lists`]).
    pub(super) samples: Vec<u32>,
    /// Bytes of those answers.
    pub(super) bytes: u64,
    pub(super) rejected: u64,
    /// 429s with `Retry-After: 1`, and with kube-apiserver's body.
    pub(super) retry_after_1: u64,
    pub(super) kube_body: u64,
    /// Runs of [`CLIENT_GO_RETRIES`] + 1 429s in a row on one connection: requests client-go would have failed.
    pub(super) gave_up: u64,
    /// The most 429s in a row on one connection.
    pub(super) longest_run: u64,
    /// Connections that got at least one LIST whole.
    pub(super) served_conns: u64,
    /// Answers that were neither a whole LIST nor a 429, cut connections and failed connects.
    pub(super) lost: u64,
    pub(super) first_lost: Option<String>,
    /// From the start until the last connection ended (LISTs started in the window read to their ends).
    pub(super) elapsed: Duration,
    /// The most LIST answers streaming at once, as the bench saw them (from their 200 to their last byte).
    pub(super) streaming_peak: u64,
    pub(super) cpu: String,
}

impl ListLoad {
    fn lose(&mut self, why: String) {
        self.lost += 1;
        self.first_lost.get_or_insert(why);
    }

    fn merge(&mut self, o: ListLoad) {
        self.samples.extend(o.samples);
        self.bytes += o.bytes;
        self.rejected += o.rejected;
        self.retry_after_1 += o.retry_after_1;
        self.kube_body += o.kube_body;
        self.gave_up += o.gave_up;
        self.longest_run = self.longest_run.max(o.longest_run);
        self.served_conns += o.served_conns;
        self.lost += o.lost;
        self.first_lost = self.first_lost.take().or(o.first_lost);
    }

    /// Every answer: the whole LISTs, the 429s and the lost ones.
    pub(super) fn answers(&self) -> u64 {
        self.samples.len() as u64 + self.rejected + self.lost
    }
}

/// LIST answers streaming now, and the most at once.
#[derive(Default)]
struct Streaming {
    now: AtomicU64,
    peak: AtomicU64,
}

/// One answer streaming: counted in [`Streaming`] until dropped.
struct StreamingGuard<'a>(&'a Streaming);

impl Streaming {
    fn enter(&self) -> StreamingGuard<'_> {
        let now = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        StreamingGuard(self)
    }
}

impl Drop for StreamingGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `conns` connections of `target`, each sending `req` (a LIST of `n` objects) as client-go would until `duration`
/// has passed, then reading the answer it is waiting for to its end. The connections are made first (the overload,
/// not a storm of TLS handshakes, is measured), then all start at once, the instant sent on `started`.
pub(super) async fn token_lists(
    target: &Target,
    pid: Option<u32>,
    conns: usize,
    duration: Duration,
    req: &Req,
    n: u64,
    started: tokio::sync::oneshot::Sender<Instant>,
) -> ListLoad {
    let streaming = Arc::new(Streaming::default());
    let connected = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let (go, start) = tokio::sync::watch::channel(None::<Instant>);
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (target, req, streaming) = (target.clone(), req.clone(), streaming.clone());
            let (connected, mut start) = (connected.clone(), start.clone());
            tokio::spawn(async move {
                let conn = target.connect().await;
                connected.wait().await;
                let Some(at) = start.wait_for(Option::is_some).await.ok().and_then(|at| *at) else {
                    return ListLoad::default(); // not started: the bench is ending
                };
                list_worker(target, conn, req, n, at + duration, streaming).await
            })
        })
        .collect();
    connected.wait().await;
    let cpu0 = CpuTicks::now(pid);
    let at = Instant::now();
    let _ = go.send(Some(at));
    let _ = started.send(at);
    let mut all = ListLoad::default();
    for w in workers {
        match w.await {
            Ok(o) => all.merge(o),
            Err(e) => all.lose(format!("worker: {e}")),
        }
    }
    all.elapsed = at.elapsed();
    all.samples.sort_unstable();
    all.streaming_peak = streaming.peak.load(Ordering::Relaxed);
    all.cpu = cpu0.usage_since(pid, all.elapsed);
    all
}

async fn list_worker(
    target: Target,
    conn: anyhow::Result<Conn>,
    req: Req,
    n: u64,
    deadline: Instant,
    streaming: Arc<Streaming>,
) -> ListLoad {
    let mut load = ListLoad::default();
    let (mut in_a_row, mut failed_connects) = (0, 0);
    let mut conn = conn.map_err(|e| load.lose(format!("connect: {e:#}"))).ok();
    while Instant::now() < deadline {
        // A connection the server closed after its last answer is replaced, as Go's transport does.
        if conn.as_ref().is_some_and(|c| c.sender.is_closed()) {
            conn = None;
        }
        let c = match &mut conn {
            Some(c) => c,
            None => match target.connect().await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    load.lose(format!("connect: {e:#}"));
                    failed_connects += 1;
                    if failed_connects >= 5 {
                        break;
                    }
                    continue;
                }
            },
        };
        let t = Instant::now();
        let answer = tokio::time::timeout(ANSWER_LIMIT, list_once(c, &req, &streaming)).await;
        match answer {
            Ok(Ok(Listed::Whole { count, bytes })) if count == n => {
                load.samples.push(micros(t.elapsed()));
                load.bytes += bytes;
                in_a_row = 0;
            }
            Ok(Ok(Listed::Whole { count, bytes })) => {
                load.lose(format!("an answer of {bytes} bytes held {count} objects, not {n}"));
            }
            Ok(Ok(Listed::Refused { status, retry_after, body })) if status == hyper::StatusCode::TOO_MANY_REQUESTS => {
                load.rejected += 1;
                load.retry_after_1 += u64::from(retry_after.as_deref() == Some("1"));
                load.kube_body += u64::from(body[..] == *TOO_MANY);
                in_a_row += 1;
                load.longest_run = load.longest_run.max(in_a_row);
                if in_a_row > CLIENT_GO_RETRIES {
                    load.gave_up += 1;
                    in_a_row = 0;
                }
                // The behaviour modelled: client-go waits the Retry-After (1 s when unreadable) before it retries.
                let wait = Duration::from_secs(retry_after.and_then(|s| s.parse().ok()).unwrap_or(1));
                tokio::time::sleep_until((Instant::now() + wait).min(deadline).into()).await;
            }
            Ok(Ok(Listed::Refused { status, body, .. })) => {
                load.lose(format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])));
            }
            Ok(Err(e)) => {
                load.lose(format!("{e:#}"));
                conn = None;
            }
            Err(_) => {
                load.lose(format!("{} {}: not read whole within {ANSWER_LIMIT:?}", req.method, req.path));
                conn = None;
            }
        }
    }
    load.served_conns = u64::from(!load.samples.is_empty());
    load
}

/// One LIST by `target` on a connection of its own, which must be answered whole: its objects and bytes.
pub(super) async fn one_list(target: &Target, req: &Req) -> anyhow::Result<(u64, u64)> {
    let mut conn = target.connect().await?;
    match tokio::time::timeout(ANSWER_LIMIT, list_once(&mut conn, req, &Streaming::default())).await {
        Ok(Ok(Listed::Whole { count, bytes })) => Ok((count, bytes)),
        Ok(Ok(Listed::Refused { status, body, .. })) => {
            anyhow::bail!("{} {} answered {status}: {}", req.method, req.path, String::from_utf8_lossy(&body))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => anyhow::bail!("{} {}: not read whole within {ANSWER_LIMIT:?}", req.method, req.path),
    }
}

/// One LIST on `conn`, its objects counted as its bytes arrive.
async fn list_once(conn: &mut Conn, req: &Req, streaming: &Streaming) -> anyhow::Result<Listed> {
    let resp = conn.send(req).await?;
    let status = resp.status();
    if !status.is_success() {
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string());
        let body = resp.into_body().collect().await.context("reading a refusal")?.to_bytes();
        return Ok(Listed::Refused { status, retry_after, body });
    }
    let _streaming = streaming.enter();
    let (mut counter, mut bytes) = (ItemCounter::default(), 0u64);
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.with_context(|| format!("the answer broke off after {bytes} bytes"))?;
        if let Ok(data) = frame.into_data() {
            bytes += data.len() as u64;
            counter.feed(&data).map_err(|e| anyhow::anyhow!("the answer is not a list, at byte {bytes}: {e}"))?;
        }
    }
    let count = counter.finish().map_err(|e| anyhow::anyhow!("the answer of {bytes} bytes: {e}"))?;
    Ok(Listed::Whole { count, bytes })
}

/// Counts the elements of the `items` array of a JSON object as its bytes arrive, holding none of them. Strings,
/// nesting and the matching of brackets are followed; nothing else of JSON is checked (a cut or garbled answer
/// shows as an error here or as a wrong count).
#[derive(Default)]
pub(super) struct ItemCounter {
    /// The brackets open, innermost last.
    open: Vec<u8>,
    in_string: bool,
    escaped: bool,
    /// In the top-level object, where the next string is a key (after its `{` or a comma).
    at_key: bool,
    /// Reading a key of the top-level object into `key`, which keeps the last one (its first bytes).
    reading_key: bool,
    key: Vec<u8>,
    /// In the top-level `items` array; seen it.
    in_items: bool,
    saw_items: bool,
    items: u64,
    /// The top-level object is closed.
    done: bool,
}

/// The bytes of a key kept: enough to tell `items` from a longer key.
const KEY_BYTES: usize = 8;

impl ItemCounter {
    pub(super) fn feed(&mut self, data: &[u8]) -> Result<(), String> {
        let mut i = 0;
        while i < data.len() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    self.key_bytes(&data[i..=i]);
                    i += 1;
                    continue;
                }
                // The string's plain bytes at once, to its closing quote or next escape.
                let Some(k) = data[i..].iter().position(|&c| c == b'"' || c == b'\\') else {
                    self.key_bytes(&data[i..]);
                    return Ok(());
                };
                self.key_bytes(&data[i..i + k]);
                i += k;
                if data[i] == b'\\' {
                    self.escaped = true;
                    self.key_bytes(&data[i..=i]);
                } else {
                    (self.in_string, self.reading_key) = (false, false);
                }
                i += 1;
                continue;
            }
            let b = data[i];
            i += 1;
            if b.is_ascii_whitespace() {
                continue;
            }
            if self.done {
                return Err(format!("{:?} after the end", b as char));
            }
            if self.in_items && self.open.len() == 2 && !matches!(b, b'{' | b',' | b']') {
                return Err("an item that is not an object".into());
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.open.len() == 1 && self.at_key {
                        self.reading_key = true;
                        self.key.clear();
                    }
                }
                b'{' | b'[' => {
                    match self.open.len() {
                        0 if b != b'{' => return Err("not a JSON object".into()),
                        1 if b == b'[' && !self.at_key && self.key == b"items" => {
                            (self.in_items, self.saw_items) = (true, true);
                        }
                        2 if self.in_items => self.items += 1,
                        _ => {}
                    }
                    self.open.push(b);
                    self.at_key = self.open.len() == 1;
                }
                b'}' | b']' => {
                    let opening = if b == b'}' { b'{' } else { b'[' };
                    if self.open.pop() != Some(opening) {
                        return Err(format!("an unmatched {:?}", b as char));
                    }
                    match self.open.len() {
                        1 => self.in_items = false,
                        0 => self.done = true,
                        _ => {}
                    }
                }
                b':' if self.open.len() == 1 => self.at_key = false,
                b',' if self.open.len() == 1 => self.at_key = true,
                _ if self.open.is_empty() => return Err("not a JSON object".into()),
                _ => {}
            }
        }
        Ok(())
    }

    fn key_bytes(&mut self, bytes: &[u8]) {
        if self.reading_key {
            let room = KEY_BYTES.saturating_sub(self.key.len());
            self.key.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }

    /// The count, once the object has ended.
    pub(super) fn finish(&self) -> Result<u64, String> {
        if !self.done {
            return Err("it ended before its JSON did".into());
        }
        if !self.saw_items {
            return Err("no items array".into());
        }
        Ok(self.items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn count(text: &str, chunk: usize) -> Result<u64, String> {
        let mut counter = ItemCounter::default();
        for part in text.as_bytes().chunks(chunk) {
            counter.feed(part)?;
        }
        counter.finish()
    }

    /// The serde counter of the LIST rows on the same text.
    fn serde_count(text: &str) -> u64 {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.try_send(bytes::Bytes::copy_from_slice(text.as_bytes())).expect("room");
        drop(tx);
        count_array(rx, "items").expect("counted")
    }

    #[test]
    fn counts_the_items_of_a_list_in_any_chunks() {
        let item = |i: u64| {
            json!({"metadata": {"name": format!("s-{i}"), "labels": {"items": "[{"}},
                "spec": {"items": [{"a": "\"}]\\"}, [1, 2]], "data": {"pad": "x\\\"{[".repeat(20)}}})
        };
        let list = json!({"apiVersion": "v1", "kind": "ShootStateList", "metadata": {"resourceVersion": "7",
            "continue": "items"}, "items": (0..25).map(item).collect::<Vec<_>>(), "tail": {"items": [{}]}});
        let text = format!(" {list}\n");
        for chunk in [1, 2, 3, 7, 64, 4096, text.len()] {
            assert_eq!(count(&text, chunk), Ok(25), "chunks of {chunk}");
        }
        assert_eq!(serde_count(&text), 25);
        assert_eq!(count(r#"{"items":[]}"#, 1), Ok(0));
        assert_eq!(count(r#"{"itemsX":[{}],"items" : [ {} , {"items":[{}]} ]}"#, 5), Ok(2));
    }

    #[test]
    fn refuses_what_is_not_a_whole_list() {
        let cut = r#"{"items":[{"a":1},{"b":"}"#;
        assert!(count(cut, 4).is_err());
        assert!(count(r#"{"items":[{"a":1}]]"#, 3).is_err());
        assert!(count(r#"{"kind":"Status","code":500}"#, 3).is_err());
        assert!(count(r#"{"items":[1,2]}"#, 3).is_err());
        assert!(count(r#"{"items":[]}{}"#, 3).is_err());
        assert!(count(r#"[{"items":[]}]"#, 3).is_err());
        assert!(count("Too many requests, please try again later.\n", 8).is_err());
    }
}
