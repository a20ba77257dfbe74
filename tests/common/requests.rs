//! HTTP helpers for tests that speak to the server request by request through a `kube::Client`: the answer's
//! code, headers and body, and assertions on the `Status` of an error.

use axum::http::{HeaderMap, Method, Request};
use http_body_util::BodyExt;
use serde_json::Value;
use std::time::Duration;

pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text()))
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().expect("ascii header").to_string())
    }
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers.get_all(name).iter().map(|v| v.to_str().expect("ascii header").to_string()).collect()
    }
    /// Asserts the HTTP code and that the body is the matching failure `Status`; returns it.
    pub fn status_err(&self, code: u16, reason: &str) -> Value {
        assert_eq!(self.status, code, "expected {code} {reason}, got {}: {}", self.status, self.text());
        assert_eq!(self.header("content-type").as_deref(), Some("application/json"), "{}", self.text());
        let s = self.json();
        assert_eq!(s["kind"], "Status", "{s}");
        assert_eq!(s["apiVersion"], "v1", "{s}");
        assert_eq!(s["status"], "Failure", "{s}");
        assert_eq!(s["code"], code, "{s}");
        assert_eq!(s["reason"], reason, "{s}");
        s
    }
    pub fn ok(&self, code: u16) -> Value {
        assert_eq!(self.status, code, "expected {code}, got {}: {}", self.status, self.text());
        self.json()
    }
}

pub fn request(method: Method, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Request<kube::client::Body> {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(kube::client::Body::from(body)).expect("request")
}

pub async fn call(c: &kube::Client, method: Method, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Resp {
    let what = format!("{method} {path}");
    let resp = tokio::time::timeout(Duration::from_secs(20), c.send(request(method, path, headers, body)))
        .await
        .unwrap_or_else(|_| panic!("{what}: no response in 20s"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .unwrap_or_else(|_| panic!("{what}: body not complete in 20s"))
        .unwrap_or_else(|e| panic!("{what}: body: {e}"))
        .to_bytes()
        .to_vec();
    Resp { status, headers, body }
}

pub async fn get(c: &kube::Client, path: &str) -> Resp {
    call(c, Method::GET, path, &[], vec![]).await
}

pub async fn get_accept(c: &kube::Client, path: &str, accept: &str) -> Resp {
    call(c, Method::GET, path, &[("accept", accept)], vec![]).await
}

pub async fn send_json(c: &kube::Client, method: Method, path: &str, body: &Value) -> Resp {
    call(c, method, path, &[("content-type", "application/json")], serde_json::to_vec(body).expect("json")).await
}

pub async fn post(c: &kube::Client, path: &str, body: &Value) -> Resp {
    send_json(c, Method::POST, path, body).await
}

pub async fn put(c: &kube::Client, path: &str, body: &Value) -> Resp {
    send_json(c, Method::PUT, path, body).await
}

pub async fn merge_patch(c: &kube::Client, path: &str, patch: &Value) -> Resp {
    let body = serde_json::to_vec(patch).expect("json");
    call(c, Method::PATCH, path, &[("content-type", "application/merge-patch+json")], body).await
}

pub async fn json_patch(c: &kube::Client, path: &str, patch: &Value) -> Resp {
    let body = serde_json::to_vec(patch).expect("json");
    call(c, Method::PATCH, path, &[("content-type", "application/json-patch+json")], body).await
}

pub async fn delete(c: &kube::Client, path: &str, body: Option<&Value>) -> Resp {
    match body {
        Some(b) => send_json(c, Method::DELETE, path, b).await,
        None => call(c, Method::DELETE, path, &[], vec![]).await,
    }
}

/// A POST to `url` (whose serving certificate `ca` signed) with a bearer token, whose body is still arriving: curl uploads from a pipe
/// (chunked) that stays open until [`HeldUpload::finish`]. The request has passed authentication and the in-flight
/// limits, and holds its seat, until then.
pub struct HeldUpload {
    curl: std::process::Child,
}

impl HeldUpload {
    pub fn start(url: &str, ca: &std::path::Path, token: &str) -> HeldUpload {
        use std::process::{Command, Stdio};
        let curl = Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(ca)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/json", "-H", "Expect:", "-X", "POST", "-T", "-"])
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl");
        HeldUpload { curl }
    }

    /// Sends `body`, ends the upload and returns the answer's code.
    pub fn finish(mut self, body: &Value) -> String {
        use std::io::Write;
        let mut stdin = self.curl.stdin.take().expect("stdin");
        stdin.write_all(body.to_string().as_bytes()).expect("write the body");
        drop(stdin);
        let out = self.curl.wait_with_output().expect("curl");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
