//! moto, the AWS emulator, on a free loopback port for the moto tests and the `bench-nlb`
//! benchmark; and a minimal HTTP client for moto's own API.
//!
//! moto is started through Python with [`CORRECTIONS`] applied, where moto 5.2.5 answers
//! differently from AWS in ways the provider relies on; without a Python that has moto, the
//! plain `moto_server` is started (and the tests that need the corrections say so).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

/// moto 5.2.5 made to answer as AWS does, where the provider or upstream's manager (run by the
/// differential suite against the same moto) relies on it. Each correction wraps one moto
/// backend call or model; the server then starts as `moto_server` does.
///
/// 1. A new Classic ELB has no health check in moto, where AWS gives every new Classic ELB its
///    default one (`TCP:<first instance port>`, interval 30, timeout 5, healthy 10, unhealthy 2).
///    Both managers compare the health check they want with the one there (upstream
///    dereferences it and exits when there is none).
/// 2. A new TCP, UDP or TLS target group does not list `preserve_client_ip.enabled` and
///    `proxy_protocol_v2.enabled`, where AWS lists both (true and false for instance targets).
///    Both managers change only attributes the target group lists, so without them the
///    `target-group-attributes` annotation would do nothing on moto.
/// 3. A Network Load Balancer's DNS name is `<name>-1.<region>.elb.amazonaws.com` in moto, the
///    form of a Classic ELB's; AWS names it `<name>-<16 hex>.elb.<region>.amazonaws.com`.
///    Upstream tells the kinds apart by that suffix and refuses every later sync of an NLB
///    whose status hostname ends in `.elb.amazonaws.com` ("cannot update Load Balancer Type").
/// 4. An ELBv2 load balancer created without `Scheme` has none in moto; AWS reports
///    `internet-facing` (upstream never sends it for an internet-facing NLB).
/// 5. A Classic listener's `InstanceProtocol` is not kept (moto reports its `Protocol`), where
///    AWS keeps what was asked (upper-cased). Without it an SSL-to-TCP or HTTPS-to-HTTP
///    listener differs on every sync, and both managers delete and re-create it each time.
/// 6. A Classic listener added after creation gets no backend in moto, so
///    `SetLoadBalancerPoliciesForBackendServer` for its instance port fails (HTTP 500); AWS
///    takes a policy for any instance port.
/// 7. A Classic ELB's `AdditionalAttributes` grow by one `elb.http.desyncmitigationmode` entry
///    per `ModifyLoadBalancerAttributes` in moto; AWS reports that attribute once, from
///    creation, and keeps it unless asked to change it. A new ELB's connection draining also
///    reports AWS's default timeout (300 s).
/// 8. moto's zones are all availability zones. AWS regions also have local zones, which both
///    managers leave out of load-balancer subnets: us-east-1 gets the local zone
///    `us-east-1-bos-1a` (`use1-bos1-az1`, type `local-zone`).
/// 9. A VPC security group takes at most 60 rules in moto, AWS's default quota; AWS raises it
///    on request (up to 1,000). The differential suite puts the rules of some 40 load
///    balancers on one Nodes' group, as a cluster with a raised quota would.
/// 10. `CreateTargetGroup` with the name of an existing target group of the same protocol, port,
///    VPC and target type fails in moto (`DuplicateTargetGroupName`); AWS returns the existing
///    one (the call is idempotent). Upstream relies on it when a sync that made a target group
///    is retried.
/// 11. `ModifyListener` refuses the TLS, UDP and TCP_UDP protocols in moto (it knows HTTP, HTTPS
///    and TCP); AWS changes an NLB's listener to any of them. Upstream modifies TLS listeners.
/// 12. `AuthorizeSecurityGroupIngress` takes any IP protocol name in moto; EC2 takes `tcp`,
///    `udp`, `icmp`, `icmpv6`, `-1` (`all`) or a number, and refuses others such as `tls`
///    (`InvalidParameterValue`), which upstream sends for an NLB's managed group and a TLS port.
/// 13. A target group forwarded to by `ModifyListener` does not list the listener's load
///    balancer in moto (only `CreateListener` links them), and one no longer forwarded to still
///    does; AWS's `LoadBalancerArns` are the load balancers whose listeners forward to it. After
///    a health-check change (a new target group, the old one deleted) upstream's
///    `DescribeTargetGroups` by load balancer then fails (`TargetGroupNotFound`).
const CORRECTIONS: &str = r#"
import sys
from moto.elb import models as elb_models
from moto.elb.models import ELBBackend, FakeBackend, FakeListener, LoadBalancer as ClassicLB
from moto.elbv2.models import ELBv2Backend
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend, Zone
from moto.ec2.models.security_groups import SecurityGroupBackend

# 1, 5: Classic ELBs.
make_classic = ELBBackend.create_load_balancer
def create_load_balancer(backend, name, zones, ports, *args, **kwargs):
    lb = make_classic(backend, name, zones, ports, *args, **kwargs)
    for listener, port in zip(lb.listeners, ports):
        keep_instance_protocol(listener, port)
    if lb.health_check is None and lb.listeners:
        first = lb.listeners[0].instance_port
        backend.configure_health_check(lb.name, "5", "10", "2", "30", "TCP:%s" % first)
    return lb
ELBBackend.create_load_balancer = create_load_balancer

def keep_instance_protocol(listener, port):
    asked = port.get("InstanceProtocol") or port.get("instance_protocol")
    listener._instance_protocol = (asked or listener.protocol).upper()
FakeListener.instance_protocol = property(lambda l: getattr(l, "_instance_protocol", l.protocol))

# 5, 6: listeners added later keep their instance protocol and get a backend.
add_listeners = ELBBackend.create_load_balancer_listeners
def create_load_balancer_listeners(backend, name, ports):
    lb = add_listeners(backend, name, ports)
    if lb is not None:
        for port in ports:
            for listener in lb.listeners:
                if int(listener.load_balancer_port) == int(port["LoadBalancerPort"]) and not hasattr(listener, "_instance_protocol"):
                    keep_instance_protocol(listener, port)
            if not any(int(b.instance_port) == int(port["InstancePort"]) for b in lb.backends):
                lb.backends.append(FakeBackend(instance_port=port["InstancePort"]))
    return lb
ELBBackend.create_load_balancer_listeners = create_load_balancer_listeners

# 7: attributes.
default_attributes = ClassicLB.get_default_attributes
def get_default_attributes(cls):
    attributes = default_attributes()
    attributes["additional_attributes"] = [("elb.http.desyncmitigationmode", "defensive")]
    attributes["connection_draining"] = {"enabled": False, "timeout": 300}
    return attributes
ClassicLB.get_default_attributes = classmethod(get_default_attributes)

modify_attributes = ELBBackend.modify_load_balancer_attributes
def modify_load_balancer_attributes(backend, name, *args, **kwargs):
    before = list(backend.get_load_balancer(name).attributes["additional_attributes"])
    modify_attributes(backend, name, *args, **kwargs)
    if not kwargs.get("additional_attributes"):
        backend.get_load_balancer(name).attributes["additional_attributes"] = before
ELBBackend.modify_load_balancer_attributes = modify_load_balancer_attributes

# 2, 3, 4: ELBv2.
make_group = ELBv2Backend.create_target_group
def create_target_group(backend, name, **kwargs):
    group = make_group(backend, name, **kwargs)
    if group.protocol in ("TCP", "UDP", "TCP_UDP", "TLS"):
        instance = group.target_type == "instance"
        group.attributes.setdefault("preserve_client_ip.enabled", "true" if instance else "false")
        group.attributes.setdefault("proxy_protocol_v2.enabled", "false")
    return group
ELBv2Backend.create_target_group = create_target_group

# 10: an idempotent CreateTargetGroup.
from moto.elbv2.exceptions import DuplicateTargetGroupName
make_group_once = ELBv2Backend.create_target_group
def create_target_group_idempotent(backend, name, **kwargs):
    try:
        return make_group_once(backend, name, **kwargs)
    except DuplicateTargetGroupName:
        for group in backend.target_groups.values():
            same = [str(getattr(group, k, None)) == str(kwargs.get(k)) for k in ("protocol", "port", "vpc_id", "target_type")]
            if group.name == name and all(same):
                return group
        raise
ELBv2Backend.create_target_group = create_target_group_idempotent

make_v2 = ELBv2Backend.create_load_balancer
def create_v2_load_balancer(backend, *args, **kwargs):
    lb = make_v2(backend, *args, **kwargs)
    if not lb.scheme:
        lb.scheme = "internet-facing"
    if lb.type == "network":
        lb.dns_name = "%s-%s.elb.%s.amazonaws.com" % (lb.name, lb.arn.rsplit("/", 1)[-1], backend.region_name)
    return lb
ELBv2Backend.create_load_balancer = create_v2_load_balancer

# 11: ModifyListener to any NLB protocol.
modify_listener = ELBv2Backend.modify_listener
def modify_listener_any(backend, arn, port=None, protocol=None, ssl_policy=None, certificates=None, actions=None):
    if protocol not in ("TLS", "UDP", "TCP_UDP"):
        return modify_listener(backend, arn, port, protocol, ssl_policy, certificates, actions)
    listener = modify_listener(backend, arn, port, None, ssl_policy, None, actions)
    listener.protocol = protocol
    if certificates:
        listener.certificate = certificates[0]["CertificateArn"]
        listener.certificates = [c["CertificateArn"] for c in certificates]
    return listener
ELBv2Backend.modify_listener = modify_listener_any

# 13: target groups list the load balancers whose listeners forward to them.
modify_listener_unlinked = ELBv2Backend.modify_listener
def modify_listener_linked(backend, arn, *args, **kwargs):
    listener = modify_listener_unlinked(backend, arn, *args, **kwargs)
    lb_arn = listener.load_balancer_arn
    lb = backend.load_balancers.get(lb_arn)
    if lb is not None:
        used = set()
        for each in lb.listeners.values():
            for action in each.default_actions:
                if action.type == "forward":
                    used.update(backend._get_target_group_arns_from(action_data=action.data))
        for tg_arn, tg in backend.target_groups.items():
            if tg_arn in used and lb_arn not in tg.load_balancer_arns:
                tg.load_balancer_arns.append(lb_arn)
            elif tg_arn not in used and lb_arn in tg.load_balancer_arns:
                tg.load_balancer_arns.remove(lb_arn)
    return listener
ELBv2Backend.modify_listener = modify_listener_linked

# 12: only the IP protocols EC2 knows.
from moto.ec2.exceptions import EC2ClientError
authorize = SecurityGroupBackend.authorize_security_group_ingress
def authorize_known_protocols(backend, group_name_or_id, ip_protocol, *args, **kwargs):
    p = str(ip_protocol).lower()
    known = p in ("tcp", "udp", "icmp", "icmpv6", "-1", "all") or (p.isdigit() and int(p) <= 255)
    if not known:
        raise EC2ClientError("InvalidParameterValue", "Invalid value '%s' for IP protocol. Unknown protocol." % ip_protocol)
    return authorize(backend, group_name_or_id, ip_protocol, *args, **kwargs)
SecurityGroupBackend.authorize_security_group_ingress = authorize_known_protocols

# 9: a raised rules-per-group quota.
from moto.ec2.exceptions import RulesPerSecurityGroupLimitExceededError
def verify_rule_count(backend, group, current, ip_ranges, source_groups=None, egress=False):
    if current + len(ip_ranges or []) + len(source_groups or []) > 1000:
        raise RulesPerSecurityGroupLimitExceededError
SecurityGroupBackend._verify_group_will_respect_rule_count_limit = verify_rule_count

# 8: a local zone.
RegionsAndZonesBackend.zones["us-east-1"].append(
    Zone(region_name="us-east-1", name="us-east-1-bos-1a", zone_id="use1-bos1-az1", zone_type="local-zone"))

from moto.server import main
sys.exit(main())
"#;

/// A moto server on a free loopback port, stopped on drop.
pub struct Moto {
    _child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The loopback port.
    pub port: u16,
    /// Whether [`CORRECTIONS`] are applied (read by the moto tests, not the benchmark).
    #[allow(dead_code)]
    pub corrected: bool,
}

/// A loopback port nothing listens on right now.
pub async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

/// Whether `python3` can import moto's server.
async fn python_has_moto() -> bool {
    Command::new("python3")
        .args(["-c", "import moto.server, moto.elb.models, moto.elbv2.models"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

impl Moto {
    /// Start moto, or `None` (after one printed line) when it is not installed.
    pub async fn start(test: &str) -> Option<Moto> {
        let corrected = python_has_moto().await;
        for _ in 0..3 {
            let port = free_port().await;
            let port_s = port.to_string();
            let mut command = if corrected {
                let mut c = Command::new("python3");
                c.args(["-c", CORRECTIONS, "-H", "127.0.0.1", "-p", &port_s]);
                c
            } else {
                let mut c = Command::new("moto_server");
                c.args(["-H", "127.0.0.1", "-p", &port_s]);
                c
            };
            let child = match command
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Straight to stderr (libtest captures `println!`): the CI log shows the skip.
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "skipping {test}: moto_server is not installed (pip install 'moto[server]==5.2.5')"
                    );
                    return None;
                }
                Err(e) => panic!("starting moto: {e}"),
            };
            let mut moto = Moto { _child: child, url: format!("http://127.0.0.1:{port}"), port, corrected };
            for _ in 0..150 {
                if http(port, "GET", "/moto-api/", "").await.is_some_and(|(status, _)| status == 200) {
                    return Some(moto);
                }
                if let Ok(Some(_)) = moto._child.try_wait() {
                    break; // the port was taken in between; try another
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("moto did not start");
    }

    /// Seeds moto's random numbers (IDs, DNS names): two servers seeded alike and then asked the
    /// same calls in the same order make the same IDs (the differential suite's two clouds).
    #[allow(dead_code)]
    pub async fn seed(&self, seed: u64) {
        let answer = http(self.port, "POST", &format!("/moto-api/seed?a={seed}"), "").await;
        assert!(answer.as_ref().is_some_and(|(status, _)| *status == 200), "seeding moto: {answer:?}");
    }
}

/// A minimal HTTP/1.1 request (for moto's own API); `None` if the server is not there.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}
