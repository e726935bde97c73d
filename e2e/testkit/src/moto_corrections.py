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
