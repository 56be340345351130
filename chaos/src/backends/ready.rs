//! How to tell that a node serves: polled after the node starts, at the
//! beginning of a run and after a fault's restart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How to tell that a node (a broker) answers.
#[derive(Debug, Clone)]
pub enum Ready {
    /// A TCP connection is accepted.
    Tcp(u16),
    /// An HTTP GET answers 2xx.
    Http(String),
    /// The protocol's first bytes, and the start of the answer after its
    /// first `skip` bytes (a length the answer begins with).
    Greeting { port: u16, send: &'static [u8], skip: usize, expect: &'static [u8] },
}

impl Ready {
    /// One attempt, given at most `timeout`: `Err` says what answered instead.
    pub async fn check(&self, timeout: Duration) -> Result<(), String> {
        match self {
            Ready::Http(url) => {
                let http = reqwest::Client::builder().timeout(timeout).build().map_err(|e| e.to_string())?;
                match http.get(url).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(format!("{url} answered {}", r.status())),
                    Err(e) => Err(format!("{url}: {e}")),
                }
            }
            Ready::Tcp(port) => {
                let addr: SocketAddr = ([127, 0, 0, 1], *port).into();
                match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("{addr}: {e}")),
                    Err(_) => Err(format!("{addr}: no answer within {timeout:?}")),
                }
            }
            Ready::Greeting { port, send, skip, expect } => {
                let (port, send, skip, expect) = (*port, *send, *skip, *expect);
                tokio::task::spawn_blocking(move || greet(port, send, skip, expect, timeout))
                    .await
                    .map_err(|e| e.to_string())?
            }
        }
    }

    /// Polls [`check`](Ready::check) until it passes, `alive` turns false, or `limit`.
    pub async fn wait(&self, limit: Duration, alive: impl Fn() -> bool) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.check(Duration::from_secs(1)).await {
                Ok(()) if alive() => return Ok(()),
                // Something else holds the port the node was to listen on.
                Ok(()) => return Err("its port answered, but the process exited".into()),
                Err(e) => e,
            };
            if !alive() {
                return Err(format!("the process exited ({last})"));
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within {limit:?} ({last})"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Sends the greeting and compares the first bytes of the answer.
fn greet(port: u16, send: &[u8], skip: usize, expect: &[u8], timeout: Duration) -> Result<(), String> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.write_all(send).map_err(|e| format!("{addr}: {e}"))?;
    let mut answer = vec![0; skip + expect.len()];
    stream.read_exact(&mut answer).map_err(|e| format!("{addr}: no greeting back: {e}"))?;
    let answer = &answer[skip..];
    if answer == expect { Ok(()) } else { Err(format!("{addr} answered {answer:02x?}, not {expect:02x?}")) }
}
