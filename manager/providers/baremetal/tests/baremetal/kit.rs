//! Helpers every module of this test binary shares.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How long a test waits for one expectation.
pub const WAIT: Duration = Duration::from_secs(30);

/// Re-runs `f` until it returns `Some` and returns that; fails naming `what` after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(WAIT, what, f).await
}

/// [`eventually`] with its own deadline.
pub async fn eventually_within<T, F, Fut>(within: Duration, what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let _named = Named(what);
    e2e_apiserver::wait::eventually(within, f).await
}

/// Names what a failed wait was waiting for (the poll loop's own message has only the time).
struct Named<'a>(&'a str);

impl Drop for Named<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(waiting for {})", self.0);
        }
    }
}

/// A `type: LoadBalancer` Service in `namespace` with one TCP `port` and `annotations`.
pub fn lb_service(namespace: &str, name: &str, port: i32, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort { port, protocol: Some("TCP".into()), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// [`lb_service`] without annotations, of `spec.loadBalancerClass` `class`.
pub fn classed_lb_service(namespace: &str, name: &str, port: i32, class: &str) -> Service {
    let mut svc = lb_service(namespace, name, port, &[]);
    if let Some(spec) = svc.spec.as_mut() {
        spec.load_balancer_class = Some(class.into());
    }
    svc
}

/// The Service's load-balancer ingress as (IP, ipMode) pairs.
pub fn ingress(service: &Service) -> Vec<(String, Option<String>)> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i.ip.clone()?, i.ip_mode.clone())))
        .collect()
}

/// A stand-in for a Node's nodePort: greets with the Node name, then echoes.
pub async fn greeting_backend(name: &str, addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    let name = name.to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// A stand-in for kube-proxy's health endpoint, always healthy.
pub async fn healthz(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind healthz");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
            });
        }
    });
}
