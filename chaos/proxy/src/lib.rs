//! haunt's TCP fault proxy on 127.0.0.1 (or a run's network gateway): forwards to a target, and on
//! command blackholes traffic (a partition) or delays the answers.
//!
//! A partition here behaves like a network that drops packets, not one that
//! refuses: connections, old and new, stay open and carry nothing until the
//! partition heals, then they are closed. Clients therefore time out, and their
//! ops are indeterminate, as they would be across a real partition.
//!
//! A crate of its own, apart from the harness (`haunt-chaos`), because every
//! byte of a faulted link passes through its read/write loop: release builds
//! compile the harness without optimisation (it waits on the system under
//! test; see the workspace's Cargo.toml) and this crate at full.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    #[default]
    Pass,
    Partition,
    Delay(Duration),
}

/// A running proxy; dropping it stops accepting and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    task: tokio::task::JoinHandle<()>,
}

/// Chunks forwarded at a time: large enough for an HTTP request in one piece.
const CHUNK_BYTES: usize = 16 * 1024;

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        FaultProxy::start_on(std::net::Ipv4Addr::LOCALHOST.into(), target).await
    }

    /// Listens on a free port of `ip` (the gateway of a run's container
    /// network, for its containers) and forwards to `target`.
    pub async fn start_on(ip: std::net::IpAddr, target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, watcher) = watch::channel(ProxyMode::Pass);
        let task = tokio::spawn(accept_loop(listener, target, watcher));
        Ok(FaultProxy { addr, mode, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<ProxyMode>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let _ = client.set_nodelay(true);
                connections.spawn(serve(client, target, mode.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Waits while partitioned; false when the proxy is gone.
async fn until_healed(mode: &mut watch::Receiver<ProxyMode>) -> bool {
    mode.wait_for(|m| *m != ProxyMode::Partition).await.is_ok()
}

async fn serve(client: TcpStream, target: SocketAddr, mut mode: watch::Receiver<ProxyMode>) {
    if *mode.borrow() == ProxyMode::Partition {
        // Held open, silent, then dropped when the partition heals.
        until_healed(&mut mode).await;
        return;
    }
    let Ok(upstream) = TcpStream::connect(target).await else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    // Delay holds back answers only: the request arrives and takes effect, the
    // answer comes late. That is the case a client cannot tell from a loss.
    let up = pump(cr, uw, mode.clone(), false);
    let down = pump(ur, cw, mode.clone(), true);
    let cut = async {
        // A partition that starts mid-connection blackholes it; the connection
        // is closed only once the partition heals.
        let _ = mode.wait_for(|m| *m == ProxyMode::Partition).await;
        until_healed(&mut mode).await;
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    delayed: bool,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Pass => {}
            ProxyMode::Delay(d) if delayed => tokio::time::sleep(d).await,
            ProxyMode::Delay(_) => {}
            // The cut in `serve` takes over; drop what was read, like the network.
            ProxyMode::Partition => std::future::pending::<()>().await,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> Option<Vec<u8>> {
        let attempt = async {
            let mut s = TcpStream::connect(addr).await.ok()?;
            s.write_all(b"ping").await.ok()?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.ok()?;
            Some(buf.to_vec())
        };
        tokio::time::timeout(Duration::from_millis(300), attempt).await.ok().flatten()
    }

    #[tokio::test]
    async fn forwards_then_cuts_then_heals() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        assert_eq!(round_trip(proxy.addr()).await.as_deref(), Some(&b"ping"[..]));
        proxy.set(ProxyMode::Partition);
        assert_eq!(round_trip(proxy.addr()).await, None, "a partition carries nothing");
        proxy.set(ProxyMode::Pass);
        assert_eq!(round_trip(proxy.addr()).await.as_deref(), Some(&b"ping"[..]), "healed");
    }

    #[tokio::test]
    async fn a_partition_cuts_an_open_connection() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"one!").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        proxy.set(ProxyMode::Partition);
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.write_all(b"two!").await.unwrap();
        let read = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf)).await;
        assert!(read.is_err(), "nothing comes back across the partition");
    }

    #[tokio::test]
    async fn delay_holds_back_the_answer() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        proxy.set(ProxyMode::Delay(Duration::from_millis(150)));
        let started = std::time::Instant::now();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut buf)).await.unwrap().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150), "the answer is delayed");
    }
}
