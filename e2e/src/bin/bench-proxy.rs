//! bench-proxy: the load-balancer data path (`ccm_provider_baremetal::datapath`) against a direct connection
//! on the same machine, everything on loopback in one process.
//!
//! Measures TCP throughput over one connection and over `--concurrent` connections, the median
//! and p99 round trip of small messages (the proxy's added latency is the difference of the
//! medians) for these paths: direct to the backend, a bare relay (accept, connect,
//! `tokio::io::copy_bidirectional`, nothing else: what any user-space copy relay costs), the
//! data path always copying through user space, always splicing (Linux), and as shipped (copy
//! while few connections are open, splice under load), and HAProxy in TCP mode with its default
//! settings when `haproxy` is installed (the L4 proxy users would otherwise run; Debian's
//! package); then the time to apply `--services` Services and then to reconfigure all of them
//! (a backend change). Client, proxy and backend share the machine's cores, so the proxy also
//! competes with its own load generator; numbers are for comparison, not for capacity planning.
//! Throughput figures are medians over `--rounds` rounds, each taking every path in turn.
//!
//! ```sh
//! cargo test --workspace --no-run && target/debug/bench-proxy          # quick, unoptimised
//! cargo build --release -p e2e --bin bench-proxy && target/release/bench-proxy
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::metrics::Metrics;
use ccm_provider_baremetal::datapath::{
    Affinity, Backend, Balance, DataPath, HealthCheck, PortSpec, Protocol, ServiceSpec, Settings, TcpForwarding,
};
use clap::Parser;
use e2e::bench::BoxError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(about = "Benchmark the L4 data path against direct loopback connections")]
struct Args {
    /// MiB sent over the single connection.
    #[arg(long, default_value_t = 256)]
    mib: u64,
    /// Concurrent connections for the aggregate throughput run.
    #[arg(long, default_value_t = 1000)]
    concurrent: usize,
    /// KiB each concurrent connection sends.
    #[arg(long, default_value_t = 256)]
    kib_each: u64,
    /// Rounds of every throughput measurement (each round takes every path once, in turn).
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Round trips for the latency run.
    #[arg(long, default_value_t = 10_000)]
    round_trips: usize,
    /// Services for the reconfiguration run.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// The HAProxy executable for the peer column (default: `haproxy` on PATH; the column is
    /// left out, with one line saying so, when there is none).
    #[arg(long)]
    haproxy: Option<std::path::PathBuf>,
}

/// The bench's loopback block (Linux answers on all of 127.0.0.0/8).
fn ip(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 77, c, d))
}

const SINK_PORT: u16 = 41001;
const ECHO_PORT: u16 = 41002;
const CHUNK: usize = 64 * 1024;

/// A listener with a deep accept queue: 1,000 connections arrive at once.
fn listen(addr: SocketAddr) -> Result<TcpListener, BoxError> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(4096)?)
}

/// Reads until EOF, then answers with the byte count (8 bytes, big endian).
async fn sink(addr: SocketAddr) -> Result<(), BoxError> {
    let listener = listen(addr)?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; CHUNK];
                let mut total = 0u64;
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = s.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    Ok(())
}

/// Echoes every byte back.
async fn echo(addr: SocketAddr) -> Result<(), BoxError> {
    let listener = listen(addr)?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Ok(())
}

/// The reference relay: accept, connect to `backend`, copy both ways with Tokio's
/// `copy_bidirectional` (its default 8 KiB buffers), nothing else.
async fn bare_relay(addr: SocketAddr, backend: SocketAddr) -> Result<(), BoxError> {
    let listener = listen(addr)?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut upstream) = TcpStream::connect(backend).await else { return };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    Ok(())
}

/// HAProxy's configuration for the peer column: TCP mode, a listener per port relaying to the
/// same backend, otherwise HAProxy's defaults (threads, buffers, no splicing), as users run it.
fn haproxy_config(listen_on: IpAddr, backend: IpAddr, ports: &[u16], max_connections: usize) -> String {
    let mut cfg = format!(
        "global\n  maxconn {}\n\ndefaults\n  mode tcp\n  timeout connect 10s\n  timeout client 5m\n  timeout server 5m\n",
        max_connections * 2 + 100
    );
    for port in ports {
        cfg.push_str(&format!(
            "\nlisten p{port}\n  bind {listen_on}:{port}\n  maxconn {}\n  server b {backend}:{port}\n",
            max_connections + 100
        ));
    }
    cfg
}

/// HAProxy in the foreground with `config`, killed when the returned child is dropped; `None`
/// (after one line saying why) when it is not installed.
async fn start_haproxy(
    executable: Option<&std::path::Path>,
    config: &str,
    probe: SocketAddr,
) -> Result<Option<tokio::process::Child>, BoxError> {
    let executable = executable.map(std::path::Path::to_path_buf).unwrap_or_else(|| "haproxy".into());
    let file = std::env::temp_dir().join(format!("bench-proxy-haproxy-{}.cfg", std::process::id()));
    std::fs::write(&file, config)?;
    let child = tokio::process::Command::new(&executable)
        .arg("-db")
        .arg("-f")
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "no HAProxy ({}): the HAProxy column is left out; `apt-get install haproxy` adds it",
                executable.display()
            );
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(probe).await.is_err() {
        if Instant::now() > deadline {
            return Err("HAProxy did not open its listener within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // HAProxy has read its file once it listens.
    let _ = std::fs::remove_file(&file);
    Ok(Some(child))
}

/// Send `bytes` to a sink and wait for its count; returns the elapsed time.
async fn send(to: SocketAddr, bytes: u64) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let mut s = TcpStream::connect(to).await?;
    let buf = vec![7u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        s.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    s.shutdown().await?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await?;
    if u64::from_be_bytes(count) != bytes {
        return Err("the sink counted a different number of bytes".into());
    }
    Ok(started.elapsed())
}

async fn concurrent(to: SocketAddr, connections: usize, bytes_each: u64) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..connections {
        set.spawn(send(to, bytes_each));
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(started.elapsed())
}

/// Round trips of 64-byte messages, `count` per path, one connection per path, taken in
/// interleaved rounds so that every path sees the same machine (wake-up latency on this shared
/// machine shifts over time); returns each path's sorted durations.
async fn round_trips(to: &[SocketAddr], count: usize) -> Result<Vec<Vec<Duration>>, BoxError> {
    const ROUNDS: usize = 20;
    let msg = [1u8; 64];
    let mut back = [0u8; 64];
    let mut streams = Vec::new();
    for addr in to {
        let mut s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        // Warm up (connection set-up, first allocation).
        for _ in 0..100 {
            s.write_all(&msg).await?;
            s.read_exact(&mut back).await?;
        }
        streams.push(s);
    }
    let mut out = vec![Vec::with_capacity(count); to.len()];
    for _ in 0..ROUNDS {
        for (s, times) in streams.iter_mut().zip(out.iter_mut()) {
            for _ in 0..count.div_ceil(ROUNDS) {
                let t = Instant::now();
                s.write_all(&msg).await?;
                s.read_exact(&mut back).await?;
                times.push(t.elapsed());
            }
        }
    }
    for times in &mut out {
        times.sort();
    }
    Ok(out)
}

/// Each path's times over `rounds` rounds, the paths taken in turn within a round so that
/// every path sees the same machine (on this shared machine the direct rate alone moved by
/// ±12% between back-to-back runs).
async fn interleaved<F, Fut>(rounds: usize, paths: &[IpAddr], f: F) -> Result<Vec<Vec<Duration>>, BoxError>
where
    F: Fn(IpAddr) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, BoxError>>,
{
    let mut times = vec![Vec::with_capacity(rounds); paths.len()];
    for _ in 0..rounds.max(1) {
        for (path, t) in paths.iter().zip(times.iter_mut()) {
            t.push(f(*path).await?);
        }
    }
    Ok(times)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn spec(key: String, address: IpAddr, port: u16, target: u16, backend: IpAddr) -> ServiceSpec {
    ServiceSpec {
        key,
        addresses: vec![address],
        ports: vec![PortSpec { protocol: Protocol::Tcp, port, target_port: target }],
        backends: vec![Backend { name: "node".into(), ip: backend }],
        health_check: HealthCheck::None,
        affinity: Affinity::None,
        balance: Balance::RoundRobin,
        source_ranges: Vec::new(),
    }
}

/// The paths every throughput and latency row measures, in column order.
struct Paths {
    direct: IpAddr,
    bare: IpAddr,
    copy: IpAddr,
    splice: IpAddr,
    auto: IpAddr,
    /// HAProxy's listener, when it runs.
    haproxy: Option<IpAddr>,
}

impl Paths {
    fn all(&self) -> Vec<IpAddr> {
        let mut all = vec![self.direct, self.bare, self.copy, self.splice, self.auto];
        all.extend(self.haproxy);
        all
    }
}

/// A throughput row: each path's median MiB/s and, in brackets, the median over the rounds of
/// its share of the same round's direct rate. `times[path][round]`, the direct path first.
fn throughput_row(label: &str, bytes: u64, times: &[Vec<Duration>]) -> String {
    let rates: Vec<Vec<f64>> = times.iter().map(|t| t.iter().map(|d| mib_per_s(bytes, *d)).collect()).collect();
    let direct = &rates[0];
    let mut row = format!("| {label} | {:.0} MiB/s |", median(direct.clone()));
    for path in &rates[1..] {
        let share = median(path.iter().zip(direct).map(|(v, d)| 100.0 * v / d).collect());
        row.push_str(&format!(" {:.0} MiB/s ({share:.0}%) |", median(path.clone())));
    }
    row
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let backend = ip(0, 1);
    sink(SocketAddr::new(backend, SINK_PORT)).await?;
    echo(SocketAddr::new(backend, ECHO_PORT)).await?;
    let haproxy_at = ip(0, 104);
    let haproxy = start_haproxy(
        args.haproxy.as_deref(),
        &haproxy_config(haproxy_at, backend, &[SINK_PORT, ECHO_PORT], args.concurrent),
        SocketAddr::new(haproxy_at, ECHO_PORT),
    )
    .await?;
    let paths = Paths {
        direct: backend,
        bare: ip(0, 102),
        copy: ip(0, 101),
        splice: ip(0, 103),
        auto: ip(0, 100),
        haproxy: haproxy.as_ref().map(|_| haproxy_at),
    };
    for port in [SINK_PORT, ECHO_PORT] {
        bare_relay(SocketAddr::new(paths.bare, port), SocketAddr::new(backend, port)).await?;
    }
    let metrics = Arc::new(Metrics::new());
    // A generous connect timeout: 1,000 simultaneous connects can see a SYN retransmitted.
    let settings = Settings { health_checks: false, connect_timeout: Duration::from_secs(10), ..Settings::default() };
    let dp = DataPath::new(settings.clone(), &metrics, CancellationToken::new());
    let copy_metrics = Arc::new(Metrics::new());
    let copying =
        DataPath::with_tcp_forwarding(settings.clone(), TcpForwarding::Copy, &copy_metrics, CancellationToken::new());
    let splice_metrics = Arc::new(Metrics::new());
    let splicing =
        DataPath::with_tcp_forwarding(settings, TcpForwarding::Splice, &splice_metrics, CancellationToken::new());
    let both_ports = vec![
        PortSpec { protocol: Protocol::Tcp, port: SINK_PORT, target_port: SINK_PORT },
        PortSpec { protocol: Protocol::Tcp, port: ECHO_PORT, target_port: ECHO_PORT },
    ];
    dp.apply(ServiceSpec { ports: both_ports.clone(), ..spec("bench/main".into(), paths.auto, 0, 0, backend) })?;
    copying.apply(ServiceSpec { ports: both_ports.clone(), ..spec("bench/copy".into(), paths.copy, 0, 0, backend) })?;
    splicing.apply(ServiceSpec { ports: both_ports, ..spec("bench/splice".into(), paths.splice, 0, 0, backend) })?;

    let haproxy_column = if paths.haproxy.is_some() { " HAProxy (TCP mode, defaults) |" } else { "" };
    println!(
        "| Measurement | Direct | Bare relay (copy_bidirectional) | Data path, copy | Data path, splice | Data path, default (auto) |{haproxy_column}"
    );
    println!("|---|---|---|---|---|---|{}", if paths.haproxy.is_some() { "---|" } else { "" });
    let bytes = args.mib * 1024 * 1024;
    let times = interleaved(args.rounds, &paths.all(), |to| send(SocketAddr::new(to, SINK_PORT), bytes)).await?;
    println!("{}", throughput_row(&format!("TCP, 1 connection, {} MiB", args.mib), bytes, &times));

    let each = args.kib_each * 1024;
    let total = each * args.concurrent as u64;
    let times =
        interleaved(args.rounds, &paths.all(), |to| concurrent(SocketAddr::new(to, SINK_PORT), args.concurrent, each))
            .await?;
    let label = format!("TCP, {} concurrent connections × {} KiB", args.concurrent, args.kib_each);
    println!("{}", throughput_row(&label, total, &times));

    let pct = |v: &[Duration], q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut row = String::from("| Round trip, 64 B, median (p99) |");
    let mut direct_median = 0.0;
    let echo_at: Vec<SocketAddr> = paths.all().into_iter().map(|ip| SocketAddr::new(ip, ECHO_PORT)).collect();
    for (i, v) in round_trips(&echo_at, args.round_trips).await?.into_iter().enumerate() {
        let (median, p99) = (us(pct(&v, 0.5)), us(pct(&v, 0.99)));
        if i == 0 {
            direct_median = median;
            row.push_str(&format!(" {median:.0} µs ({p99:.0} µs) |"));
        } else {
            row.push_str(&format!(" {median:.0} µs ({p99:.0} µs), {:+.0} µs |", median - direct_median));
        }
    }
    println!("{row}");
    copying.shutdown();
    splicing.shutdown();
    drop(haproxy);

    // Reconfiguration: N Services, each its own address and listener.
    let addr = |i: usize| ip(1 + (i / 250) as u8, 1 + (i % 250) as u8);
    let started = Instant::now();
    for i in 0..args.services {
        dp.apply(spec(format!("bench/s{i}"), addr(i), 8080, SINK_PORT, backend))?;
    }
    let create = started.elapsed();
    let other_backend = ip(0, 2);
    let started = Instant::now();
    for i in 0..args.services {
        dp.apply(spec(format!("bench/s{i}"), addr(i), 8080, SINK_PORT, other_backend))?;
    }
    let reconfigure = started.elapsed();
    let started = Instant::now();
    for i in 0..args.services {
        dp.apply(spec(format!("bench/s{i}"), addr(i), 8080, SINK_PORT, other_backend))?;
    }
    let unchanged = started.elapsed();
    println!();
    println!("| {} Services | Open every listener | Change every backend | Re-apply unchanged |", args.services);
    println!("|---|---|---|---|");
    println!(
        "| data path | {:.1} ms | {:.1} ms | {:.1} ms |",
        create.as_secs_f64() * 1e3,
        reconfigure.as_secs_f64() * 1e3,
        unchanged.as_secs_f64() * 1e3
    );
    dp.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_s_share_is_the_median_of_its_ratios_to_the_same_round_s_direct_rate() {
        let ms = Duration::from_millis;
        // 1 MiB per run; direct slows down in round 3, and the proxy with it.
        let direct = vec![ms(100), ms(100), ms(400)];
        let proxy = vec![ms(125), ms(200), ms(500)];
        let row = throughput_row("t", 1024 * 1024, &[direct, proxy]);
        // Direct: 10, 10, 2.5 MiB/s (median 10); proxy: 8, 5, 2 (median 5); shares 80, 50, 80%.
        assert_eq!(row, "| t | 10 MiB/s | 5 MiB/s (80%) |");
    }

    #[test]
    fn haproxy_relays_each_port_to_the_same_backend_in_tcp_mode_with_room_for_every_connection() {
        let cfg = haproxy_config(ip(0, 104), ip(0, 1), &[41001, 41002], 1000);
        assert!(cfg.contains("mode tcp"), "{cfg}");
        assert!(cfg.contains("maxconn 2100"), "{cfg}");
        for port in [41001, 41002] {
            assert!(
                cfg.contains(&format!("bind 127.77.0.104:{port}\n  maxconn 1100\n  server b 127.77.0.1:{port}")),
                "{cfg}"
            );
        }
        assert!(!cfg.contains("splice"), "HAProxy runs with its defaults: {cfg}");
    }
}
