//! Unit tests of the bench: its parsers, counters and tables.

use super::*;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use std::process::Command;

fn answer(response: Value) -> Vec<u8> {
    json!({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": response}).to_string().into_bytes()
}

#[test]
fn cpus_split_with_the_larger_half_for_the_server() {
    assert_eq!(split_cpus(vec![]), None);
    assert_eq!(split_cpus(vec![3]), None);
    assert_eq!(split_cpus(vec![0, 1]), Some((vec![0], vec![1])));
    assert_eq!(split_cpus(vec![0, 2, 5]), Some((vec![0, 2], vec![5])));
    assert_eq!(split_cpus(vec![0, 1, 2, 3]), Some((vec![0, 1], vec![2, 3])));
    assert_eq!(cpu_list(&[1]), "CPU 1");
    assert_eq!(cpu_list(&[0, 1]), "CPUs 0,1");
    assert_eq!((workers(1).as_str(), workers(2).as_str()), ("1 worker thread", "2 worker threads"));
    assert_eq!(parse_cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
    assert_eq!(parse_cpu_list("3"), Some(vec![3]));
    for bad in ["", "1-", "2-1", "a", "0,,1", "99999"] {
        assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
    }
}

#[test]
fn a_pinned_thread_and_what_it_starts_stay_on_its_cpus() {
    let allowed = allowed_cpus();
    assert!(!allowed.is_empty(), "no CPU in this thread's affinity mask");
    let last = *allowed.last().unwrap();
    std::thread::spawn(move || {
        pin_current_thread(&[last]).expect("pinning to an allowed CPU");
        assert_eq!(allowed_cpus(), vec![last]);
        // A thread started from here inherits the mask, and so does a process (the server, in the bench).
        assert_eq!(std::thread::spawn(allowed_cpus).join().unwrap(), vec![last]);
        let status = Command::new("cat").arg("/proc/self/status").output().expect("cat /proc/self/status");
        let status = String::from_utf8_lossy(&status.stdout).into_owned();
        let line = status_value(&status, "Cpus_allowed_list:").expect("Cpus_allowed_list");
        assert_eq!(parse_cpu_list(line), Some(vec![last]), "{line}");
    })
    .join()
    .unwrap();
    // Other threads keep theirs, as `/proc` says of the process (its main thread's mask).
    assert_eq!(cpus_allowed(std::process::id()), Some(allowed.clone()));
    assert_eq!(allowed_cpus(), allowed);
    assert!(pin_current_thread(&[libc::CPU_SETSIZE as usize]).is_err());
}

#[test]
fn templates_fill_every_placeholder() {
    let t = Template::new(&admission_review("uid-@N@", "CREATE", &admitted_migration("@N@")));
    let v: Value = serde_json::from_slice(&t.render("r-0000042")).expect("JSON");
    assert_eq!(v["request"]["uid"], "uid-r-0000042");
    assert_eq!(v["request"]["name"], "deployments-r-0000042");
    assert_eq!(v["request"]["object"]["metadata"]["name"], "deployments-r-0000042");
    assert!(!String::from_utf8_lossy(&t.render("x")).contains("@N@"));
}

#[test]
fn wrong_admission_answers_do_not_count() {
    let ok = answer(json!({"uid": "u1", "allowed": true}));
    assert_eq!(check_review(&ok, "u1", None), Ok(()));
    // Another request's uid, a denial, a patch from /validate, a missing or different patch from /mutate.
    assert!(check_review(&ok, "u2", None).is_err());
    assert!(check_review(&answer(json!({"uid": "u1", "allowed": false})), "u1", None).is_err());
    let patched = answer(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch", "patch": "W10="}));
    assert!(check_review(&patched, "u1", None).is_err());
    assert_eq!(check_review(&patched, "u1", Some("W10=")), Ok(()));
    assert!(check_review(&patched, "u1", Some("W3t9XQ==")).is_err());
    assert!(check_review(&ok, "u1", Some("W10=")).is_err());
    assert!(check_review(b"{}", "u1", None).is_err());
    assert!(check_review(b"not json", "u1", None).is_err());
    let v1beta1 =
        br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true}}"#;
    assert!(check_review(v1beta1, "u1", None).is_err());
}

#[test]
fn paired_rows_follow_their_pair_with_the_ratio() {
    let row = |name: &str, rps: f64, pair: Option<&str>| Row {
        scenario: name.into(),
        rps_v: Some(rps),
        pair: pair.map(String::from),
        ..Row::default()
    };
    let mut rows = vec![row("GET", 1000.0, None), row("LIST", 100.0, None), row("CREATE", 500.0, None)];
    merge_pairs(
        &mut rows,
        vec![row("GET, on etcd", 250.0, Some("GET")), row("CREATE, on etcd", 1000.0, Some("CREATE"))],
        "the embedded store's",
    );
    let names: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    assert_eq!(names, ["GET", "GET, on etcd", "LIST", "CREATE", "CREATE, on etcd"]);
    assert!(rows[1].notes.starts_with("requests/s x0.25 of the embedded store's"), "{}", rows[1].notes);
    assert!(rows[4].notes.starts_with("requests/s x2.00"), "{}", rows[4].notes);
}

/// Feeds `pieces` to one connection's parser as successive reads; every answer completed, and what is left.
fn parse_reads(pieces: &[&[u8]]) -> anyhow::Result<(Vec<Answer>, Vec<u8>)> {
    let (mut parser, mut buf, mut answers) = (ResponseParser::default(), BytesMut::new(), Vec::new());
    parser.start(false);
    for piece in pieces {
        buf.extend_from_slice(piece);
        while let Some(answer) = parser.advance(&mut buf)? {
            answers.push(answer);
            parser.start(false);
        }
    }
    Ok((answers, buf.to_vec()))
}

/// `wire` parsed as one read, split in two at every position, and in reads of 1 and 7 bytes: always the
/// same answers, nothing left over.
fn parse_every_way(wire: &[u8]) -> Vec<Answer> {
    let (whole, rest) = parse_reads(&[wire]).expect("parses");
    assert!(rest.is_empty(), "left over: {:?}", String::from_utf8_lossy(&rest));
    let same = |answers: Vec<Answer>, how: &str| {
        let show = |a: &[Answer]| a.iter().map(|a| (a.status, a.body.clone(), a.close)).collect::<Vec<_>>();
        assert_eq!(show(&answers), show(&whole), "{how}");
    };
    for at in 0..=wire.len() {
        let (answers, rest) = parse_reads(&[&wire[..at], &wire[at..]]).expect("parses");
        assert!(rest.is_empty());
        same(answers, &format!("split at {at}"));
    }
    for size in [1, 7] {
        let pieces: Vec<&[u8]> = wire.chunks(size).collect();
        let (answers, rest) = parse_reads(&pieces).expect("parses");
        assert!(rest.is_empty());
        same(answers, &format!("reads of {size} bytes"));
    }
    whole
}

const CHUNKED: &[u8] = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\
    Transfer-Encoding: chunked\r\n\r\n\
    5;name=value\r\n{\"a\":\r\n\
    1C ; quoted=\"x;y\"\r\n \"bbbbbbbbbbbbbbbbbbbbbbbbb\"\r\n\
    1\r\n}\r\n\
    0;last\r\nX-Trailer: 1\r\nOther: two\r\n\r\n";

#[test]
fn content_length_answers() {
    let wire = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":\"bc\"}\n";
    let answers = parse_every_way(wire);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].status, hyper::StatusCode::OK);
    assert_eq!(&answers[0].body[..], b"{\"a\":\"bc\"}\n");
    assert!(!answers[0].close);
}

#[test]
fn chunked_answers_with_extensions_and_trailers() {
    let answers = parse_every_way(CHUNKED);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].status, hyper::StatusCode::CREATED);
    assert_eq!(&answers[0].body[..], format!("{{\"a\": \"{}\"}}", "b".repeat(25)).as_bytes());
    assert!(!answers[0].close);
}

#[test]
fn a_big_body_in_many_small_reads() {
    let body: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut wire = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    wire.extend_from_slice(&body);
    for size in [1, 100, 1500, 16 * 1024] {
        let pieces: Vec<&[u8]> = wire.chunks(size).collect();
        let (answers, rest) = parse_reads(&pieces).expect("parses");
        assert!(rest.is_empty());
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].body, body);
    }
    // The same body sent in chunks of 1000 bytes.
    let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in body.chunks(1000) {
        wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    for size in [1, 999, 1000, 16 * 1024] {
        let pieces: Vec<&[u8]> = wire.chunks(size).collect();
        let (answers, rest) = parse_reads(&pieces).expect("parses");
        assert!(rest.is_empty());
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].body, body);
    }
}

#[test]
fn keep_alive_answers_back_to_back() {
    let mut wire = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
    wire.extend_from_slice(CHUNKED);
    wire.extend_from_slice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
    let answers = parse_every_way(&wire);
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 201, 404]);
    assert_eq!(&answers[0].body[..], b"ok");
    assert!(answers[1].body.starts_with(b"{\"a\": \"b"));
    assert!(answers[2].body.is_empty());
    // Two answers in one read, the start of a third one left for the next read.
    let (answers, rest) = parse_reads(&[&wire[..wire.len() - 5]]).expect("parses");
    assert_eq!(answers.len(), 2);
    assert_eq!(rest, &wire[wire.len() - 45..wire.len() - 5]);
}

#[test]
fn answers_that_close_the_connection() {
    let closing = parse_every_way(
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: keep-alive, Close\r\nContent-Length: 4\r\n\r\nbusy",
    );
    assert!(closing[0].close);
    assert_eq!(closing[0].status, hyper::StatusCode::SERVICE_UNAVAILABLE);
    assert!(parse_every_way(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")[0].close);
    assert!(!parse_every_way(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")[0].close);
    // No framing: the body ends with the connection.
    let (mut parser, mut buf) = (ResponseParser::default(), BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\nuntil eof"[..]));
    parser.start(false);
    assert!(parser.advance(&mut buf).expect("parses").is_none());
    let answer = parser.at_eof(&mut buf).expect("complete at EOF");
    assert_eq!((&answer.body[..], answer.close), (&b"until eof"[..], true));
    // EOF in the middle of an answer is an error.
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"[..]);
    parser.start(false);
    assert!(parser.advance(&mut buf).expect("parses").is_none());
    assert!(parser.at_eof(&mut buf).is_err());
}

#[test]
fn interim_bodiless_and_head_answers() {
    let wire = b"HTTP/1.1 100 Continue\r\n\r\n\
        HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n\
        HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx";
    let answers = parse_every_way(wire);
    assert_eq!(answers.iter().map(|a| (a.status.as_u16(), a.body.len())).collect::<Vec<_>>(), [(204, 0), (200, 1)]);
    let mut parser = ResponseParser::default();
    parser.start(true);
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 123\r\n\r\n"[..]);
    let answer = parser.advance(&mut buf).expect("parses").expect("complete");
    assert!(answer.body.is_empty() && buf.is_empty());
}

#[test]
fn malformed_answers_are_errors() {
    for wire in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/9 200 OK\r\n\r\n",
        b"garbage\r\n\r\n",
    ] {
        assert!(parse_reads(&[wire]).is_err(), "{:?}", String::from_utf8_lossy(wire));
    }
}

#[test]
fn requests_carry_their_headers_and_body() {
    let mut out = b"left over".to_vec();
    let host = b"host: 127.0.0.1:8443\r\n";
    write_request(&mut out, host, &Req::post("/validate?timeout=10s".into(), Bytes::from_static(b"{}")));
    assert_eq!(
        out,
        b"POST /validate?timeout=10s HTTP/1.1\r\nhost: 127.0.0.1:8443\r\naccept: application/json\r\n\
          content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    );
    write_request(&mut out, host, &Req::get("/api".into()).accept(TABLE));
    assert_eq!(out, format!("GET /api HTTP/1.1\r\nhost: 127.0.0.1:8443\r\naccept: {TABLE}\r\n\r\n").as_bytes());
}

#[test]
fn big_shoot_state_is_about_100_kib() {
    let len = big_shoot_state("bench", "s-1").to_string().len();
    assert!((100 * 1024..110 * 1024).contains(&len), "{len}");
    // The first size at or above 100 KiB: one secret fewer is below it.
    let mut smaller = big_shoot_state("bench", "s-1");
    smaller["spec"]["gardener"].as_array_mut().expect("secrets").pop();
    assert!(smaller.to_string().len() < 100 * 1024);
    let (a, b) = (big_shoot_state_seeded("bench", "s-1", 1), big_shoot_state_seeded("bench", "s-1", 2));
    assert_ne!(a["spec"]["gardener"][0]["data"], b["spec"]["gardener"][0]["data"]);
    assert_eq!(a.to_string().len(), b.to_string().len());
}

/// `text` fed to [`count_array`] in chunks of `size` bytes.
fn count_in_chunks(text: &str, size: usize, key: &str) -> anyhow::Result<u64> {
    let (tx, rx) = tokio::sync::mpsc::channel(text.len().max(1));
    for chunk in text.as_bytes().chunks(size) {
        tx.try_send(Bytes::copy_from_slice(chunk)).expect("room in the channel");
    }
    drop(tx);
    count_array(rx, key)
}

#[test]
fn lists_are_counted_as_they_arrive() {
    let list = json!({"kind": "List", "metadata": {"resourceVersion": "7"},
        "items": [{"a": [1, {"b": "]}"}]}, {}, {"items": [1, 2]}]})
    .to_string();
    let table = json!({"kind": "Table", "columnDefinitions": [{"name": "Name"}],
        "rows": [{"cells": ["a"], "object": {"items": []}}, {"cells": ["b"]}]})
    .to_string();
    for size in [1, 7, 4096] {
        assert_eq!(count_in_chunks(&list, size, "items").expect("a list"), 3);
        assert_eq!(count_in_chunks(&table, size, "rows").expect("a table"), 2);
    }
    assert_eq!(count_in_chunks(r#"{"items": null}"#, 3, "items").ok(), None);
    assert!(count_in_chunks(&table, 5, "items").is_err());
    assert!(count_in_chunks(&list[..list.len() - 1], 5, "items").is_err(), "cut off");
    assert!(count_in_chunks(&format!("{list}x"), 5, "items").is_err(), "trailing bytes");
}

#[test]
fn medians() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
}

#[test]
fn retry_after_of_each_answer() {
    let wire = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After:  1 \r\ncontent-length: 43\r\n\r\n\
        Too many requests, please try again later.\n\
        HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let answers = parse_every_way(wire);
    assert_eq!(answers[0].retry_after.as_deref(), Some("1"));
    assert_eq!(&answers[0].body[..], TOO_MANY);
    assert_eq!(answers[1].retry_after, None);
}
