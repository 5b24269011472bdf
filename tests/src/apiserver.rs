//! An API server stand-in for `tests/tests/k8s_dra*.rs`: HTTP/1.1 with JSON on a loopback port,
//! serving what `sharectl dra-plugin` asks of a Kubernetes API server (`resource.k8s.io/v1`):
//! `GET` of a namespaced ResourceClaim (the test adds claims as the API server would return
//! them once allocated), and `GET`/`POST`/`PUT` of cluster-scoped ResourceSlices, which it
//! records in order, giving each write a new `resourceVersion` and refusing an update whose
//! `resourceVersion` is stale (409), as the API server does. Anything else is 404 with a
//! `Status` body. Each connection has its own thread; requests are read with their
//! `Content-Length` (the only framing the plugin's client sends).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A ResourceSlice write the stand-in accepted.
#[derive(Clone, Debug)]
pub struct SliceWrite {
    /// `create` or `update`.
    pub verb: &'static str,
    pub slice: Value,
    pub at: std::time::Instant,
}

#[derive(Default)]
struct State {
    claims: HashMap<(String, String), Value>,
    slices: HashMap<String, Value>,
    writes: Vec<SliceWrite>,
    version: u64,
    requests: usize,
}

pub struct ApiServer {
    port: u16,
    state: Arc<Mutex<State>>,
}

/// A loopback port nobody listens on now (for an API server that is not up yet).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

impl ApiServer {
    /// Serves on a new loopback port.
    pub fn start() -> ApiServer {
        ApiServer::start_on(0)
    }

    /// Serves on `port` (0: any).
    pub fn start_on(port: u16) -> ApiServer {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state: Arc<Mutex<State>> = Arc::default();
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        ApiServer { port, state }
    }

    /// A kubeconfig naming this server (plain HTTP, no credentials), written in `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig(dir, self.port)
    }

    /// Serves `claim` (a `resource.k8s.io/v1` ResourceClaim as the API server returns it).
    pub fn add_claim(&self, claim: Value) {
        let ns = claim["metadata"]["namespace"].as_str().unwrap().to_string();
        let name = claim["metadata"]["name"].as_str().unwrap().to_string();
        self.state.lock().unwrap().claims.insert((ns, name), claim);
    }

    /// Deletes a claim (as when its pod is gone).
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.state
            .lock()
            .unwrap()
            .claims
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// The ResourceSlice writes so far, in order.
    pub fn slice_writes(&self) -> Vec<SliceWrite> {
        self.state.lock().unwrap().writes.clone()
    }

    /// The slice named `name` as stored now.
    pub fn slice(&self, name: &str) -> Option<Value> {
        self.state.lock().unwrap().slices.get(name).cloned()
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }
}

/// A kubeconfig for `http://127.0.0.1:<port>`, written in `dir`.
pub fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: http://127.0.0.1:{port}\n\
         users:\n- name: plugin\n  user: {{}}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: plugin\n\
         current-context: stand-in\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code }),
    )
}

fn serve(conn: TcpStream, state: &Mutex<State>) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_string(), target.to_string());
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
                assert!(
                    !k.eq_ignore_ascii_case("transfer-encoding"),
                    "the stand-in reads Content-Length bodies only: {h}"
                );
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let path = target.split('?').next().unwrap_or("");
        let (code, v) = route(state, &method, path, &body);
        let text = v.to_string();
        let reason = match code {
            200 => "OK",
            201 => "Created",
            404 => "Not Found",
            409 => "Conflict",
            _ => "Bad Request",
        };
        let head = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            text.len()
        );
        if w.write_all(head.as_bytes())
            .and_then(|_| w.write_all(text.as_bytes()))
            .is_err()
        {
            return;
        }
    }
}

fn route(state: &Mutex<State>, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut s = state.lock().unwrap();
    s.requests += 1;
    if let Some(rest) = path.strip_prefix(CLAIMS) {
        let p: Vec<&str> = rest.split('/').collect();
        if let [ns, "resourceclaims", name] = p[..] {
            if method == "GET" {
                return match s.claims.get(&(ns.to_string(), name.to_string())) {
                    Some(c) => (200, c.clone()),
                    None => status(
                        404,
                        "NotFound",
                        &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                    ),
                };
            }
        }
    }
    if let Some(rest) = path.strip_prefix(SLICES) {
        let name = rest.strip_prefix('/').unwrap_or("");
        let not_found = |name: &str| {
            status(
                404,
                "NotFound",
                &format!("resourceslices.resource.k8s.io \"{name}\" not found"),
            )
        };
        match (method, name.is_empty()) {
            ("GET", false) => {
                return s
                    .slices
                    .get(name)
                    .cloned()
                    .map_or_else(|| not_found(name), |v| (200, v))
            }
            ("POST", true) => {
                let mut v: Value = serde_json::from_slice(body).unwrap();
                let name = v["metadata"]["name"].as_str().unwrap().to_string();
                if s.slices.contains_key(&name) {
                    return status(409, "AlreadyExists", "already exists");
                }
                s.version += 1;
                v["metadata"]["resourceVersion"] = json!(s.version.to_string());
                v["metadata"]["uid"] = json!(format!("slice-uid-{}", s.version));
                s.slices.insert(name, v.clone());
                s.writes.push(SliceWrite {
                    verb: "create",
                    slice: v.clone(),
                    at: std::time::Instant::now(),
                });
                return (201, v);
            }
            ("PUT", false) => {
                let mut v: Value = serde_json::from_slice(body).unwrap();
                let Some(old) = s.slices.get(name) else {
                    return not_found(name);
                };
                if v["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                    return status(409, "Conflict", "the object has been modified");
                }
                v["metadata"]["uid"] = old["metadata"]["uid"].clone();
                s.version += 1;
                v["metadata"]["resourceVersion"] = json!(s.version.to_string());
                s.slices.insert(name.to_string(), v.clone());
                s.writes.push(SliceWrite {
                    verb: "update",
                    slice: v.clone(),
                    at: std::time::Instant::now(),
                });
                return (200, v);
            }
            _ => {}
        }
    }
    status(
        404,
        "NotFound",
        &format!("{method} {path}: not served by the stand-in"),
    )
}
