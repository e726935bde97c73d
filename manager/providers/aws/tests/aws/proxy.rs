//! The fault proxy in front of moto: counts requests, injects throttling answers, and "kills"
//! the caller right after a chosen request took effect.

use crate::kit::*;

#[derive(Default)]
pub(crate) struct Faults {
    /// Throttling answers still to give, by action.
    pub(crate) throttle: BTreeMap<String, usize>,
    /// Hold the answer of the N-th request (1-based) forever, after it reached moto.
    pub(crate) hold_at: Option<usize>,
    pub(crate) requests: usize,
    pub(crate) throttled: usize,
    pub(crate) actions: Vec<String>,
    /// (action, access key ID it was signed with), per request.
    pub(crate) signed_by: Vec<(String, String)>,
    /// (action, request head), per request.
    pub(crate) heads: Vec<(String, String)>,
}

/// A proxy in front of moto that throttles chosen actions and can "kill" the caller right after
/// a request took effect (the answer never comes back).
pub(crate) struct Proxy {
    pub(crate) url: String,
    pub(crate) faults: Arc<Mutex<Faults>>,
    pub(crate) held: Arc<tokio::sync::Notify>,
    pub(crate) held_count: Arc<AtomicUsize>,
}

impl Proxy {
    pub(crate) async fn start(moto_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Mutex::new(Faults::default()));
        let held = Arc::new(tokio::sync::Notify::new());
        let held_count = Arc::new(AtomicUsize::new(0));
        let (f, h, hc) = (faults.clone(), held.clone(), held_count.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, moto_port, f.clone(), h.clone(), hc.clone()));
            }
        });
        Proxy { url, faults, held, held_count }
    }

    pub(crate) fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap());
    }
}

pub(crate) async fn serve(
    mut conn: TcpStream,
    moto_port: u16,
    faults: Arc<Mutex<Faults>>,
    held: Arc<tokio::sync::Notify>,
    held_count: Arc<AtomicUsize>,
) {
    while let Some((head, body)) = wire::read_request(&mut conn).await {
        let action = wire::action(&body);
        let (throttle, hold) = {
            let mut f = faults.lock().unwrap();
            f.requests += 1;
            f.actions.push(action.clone());
            let key = head.split("Credential=").nth(1).and_then(|c| c.split('/').next()).unwrap_or("").to_string();
            f.signed_by.push((action.clone(), key));
            f.heads.push((action.clone(), head.clone()));
            let throttle = match f.throttle.get_mut(&action) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    f.throttled += 1;
                    true
                }
                _ => false,
            };
            (throttle, !throttle && f.hold_at == Some(f.requests))
        };
        if throttle {
            if conn.write_all(wire::throttled_response(wire::is_ec2(&head)).as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        // Forward on a fresh connection, one request each.
        let Some(resp) = wire::forward(moto_port, &head, &body).await else { return };
        if hold {
            // The cloud did it; the caller never learns. Wait until the test ends.
            held_count.fetch_add(1, Ordering::SeqCst);
            held.notify_one();
            std::future::pending::<()>().await;
        }
        if conn.write_all(&resp).await.is_err() {
            return;
        }
        // moto was asked to close; so do we, after a complete answer.
        return;
    }
}

/// A provider through the proxy that retries little, so faults reach the caller, and counts
/// throttling over a short window, so the delays it asks for fit the test. Standard retry mode:
/// the adaptive mode's rate limiter would slow a burst-ridden test to half a request a second.
pub(crate) fn proxied(url: &str, attempts: u32) -> Arc<AwsProvider> {
    proxied_with(url, attempts, config())
}

/// [`proxied`] with another cloud-config.
pub(crate) fn proxied_with(url: &str, attempts: u32, config: AwsConfig) -> Arc<AwsProvider> {
    let options = AwsOptions {
        max_attempts: attempts,
        throttle_window: Duration::from_secs(4),
        adaptive_retry: false,
        ..options_for(url)
    };
    Arc::new(AwsProvider::new(config, CLUSTER, options))
}

/// `NLBSecurityGroupMode = Managed`.
pub(crate) fn managed_config() -> AwsConfig {
    AwsConfig { nlb_security_group_mode: "Managed".into(), ..config() }
}

/// IDs of the NLBs' managed security groups in moto (by upstream's description).
pub(crate) async fn managed_sgs(c: &Clients) -> BTreeSet<String> {
    let r = c.ec2.describe_security_groups().send().await.unwrap();
    r.security_groups()
        .iter()
        .filter(|g| g.description() == Some(ccm_provider_aws::lb::MANAGED_GROUP_DESCRIPTION))
        .map(|g| g.group_id().unwrap().to_string())
        .collect()
}

/// moto with the world seeded, `count` instances as Ready Nodes, and a fault proxy in front.
pub(crate) struct Seeded {
    pub(crate) moto: Moto,
    pub(crate) direct: Arc<AwsProvider>,
    pub(crate) c: Clients,
    pub(crate) nodes: Vec<Node>,
    pub(crate) proxy: Proxy,
}

pub(crate) async fn seeded(test: &str, count: i32) -> Option<Seeded> {
    let moto = Moto::start(test).await?;
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, count).await;
    let nodes = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    let proxy = Proxy::start(moto.port).await;
    Some(Seeded { moto, direct, c, nodes, proxy })
}

/// Every non-`Describe*` call counts as mutating (EC2, ELB and ELBv2 name reads that way).
pub(crate) fn mutating(actions: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    actions.iter().filter(|(a, _)| !a.starts_with("Describe") && !a.is_empty()).map(|(a, n)| (a.clone(), *n)).collect()
}

/// Requests by action since `from` (the proxy logs every request).
pub(crate) fn actions_since(proxy: &Proxy, from: usize) -> BTreeMap<String, usize> {
    let f = proxy.faults.lock().unwrap();
    let mut out = BTreeMap::new();
    for a in &f.actions[from..] {
        *out.entry(a.clone()).or_insert(0) += 1;
    }
    out
}
