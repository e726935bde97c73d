//! moto, the AWS emulator, as the tests run it: with corrections where moto 5.2.5 answers
//! differently from AWS (the aws provider's suite on loopback, the real-cluster scenario on the
//! cluster's segment).

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
///     VPC and target type fails in moto (`DuplicateTargetGroupName`); AWS returns the existing
///     one (the call is idempotent). Upstream relies on it when a sync that made a target group
///     is retried.
/// 11. `ModifyListener` refuses the TLS, UDP and TCP_UDP protocols in moto (it knows HTTP, HTTPS
///     and TCP); AWS changes an NLB's listener to any of them. Upstream modifies TLS listeners.
/// 12. `AuthorizeSecurityGroupIngress` takes any IP protocol name in moto; EC2 takes `tcp`,
///     `udp`, `icmp`, `icmpv6`, `-1` (`all`) or a number, and refuses others such as `tls`
///     (`InvalidParameterValue`), which upstream sends for an NLB's managed group and a TLS port.
/// 13. A target group forwarded to by `ModifyListener` does not list the listener's load
///     balancer in moto (only `CreateListener` links them), and one no longer forwarded to still
///     does; AWS's `LoadBalancerArns` are the load balancers whose listeners forward to it. After
///     a health-check change (a new target group, the old one deleted) upstream's
///     `DescribeTargetGroups` by load balancer then fails (`TargetGroupNotFound`).
pub const CORRECTIONS: &str = include_str!("moto_corrections.py");

/// The `[ServiceOverride]` sections of an aws cloud-config that send every service the
/// managers call (EC2, both load-balancer APIs, KMS) to `url` in `region`.
pub fn service_overrides(url: &str, region: &str) -> String {
    [
        ("EC2", "ec2"),
        ("Elastic Load Balancing", "elasticloadbalancing"),
        ("Elastic Load Balancing v2", "elasticloadbalancing"),
        ("KMS", "kms"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (service, signing))| {
        format!(
            "\n[ServiceOverride \"{}\"]\nService = {service}\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\nSigningName = {signing}\n",
            i + 1
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_service_the_managers_call_goes_to_the_url() {
        let text = super::service_overrides("https://198.19.0.1:5000", "us-east-1");
        assert_eq!(text.matches("URL = https://198.19.0.1:5000\n").count(), 4);
        assert!(text.contains("[ServiceOverride \"3\"]\nService = Elastic Load Balancing v2\n"), "{text}");
    }
}
