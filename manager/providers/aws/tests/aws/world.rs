//! The world the runs against upstream's binary share: a VPC laid out as real clusters' VPCs
//! are, seeded into a moto server the same way every time, so two servers seeded alike hold
//! the same IDs (see [`Moto::seed`]).
//!
//! Subnets, by `Name` tag (zone, routes, tags) and what upstream's subnet discovery makes of
//! them:
//!
//! | Name | Zone | Public | Tags | Internet-facing | Internal |
//! |---|---|---|---|---|---|
//! | `a-elb` | a | yes | cluster, `role/elb` | chosen (role tag) | loses to `a-private` |
//! | `a-plain` | a | yes | none | loses (no role tag) | loses |
//! | `a-private` | a | no | cluster, `role/internal-elb` | left out (private) | chosen (role tag) |
//! | `b-elb` | b | yes | cluster (`owned`), `role/elb` | chosen | chosen |
//! | `c-untagged` | c | yes | none | chosen (untagged counts) | chosen |
//! | `d-other` | d | yes | another cluster's, `role/elb` | left out | left out |
//! | `e-private` | e | no | cluster, `role/internal-elb` | left out (private) | chosen |
//! | `f-one`, `f-two` | f | yes | cluster | the lower ID | the lower ID |
//! | `local` | `us-east-1-bos-1a` (a local zone) | yes | cluster, `role/elb` | left out | left out |
//!
//! Security groups: `nodes` (tagged for the cluster: the Nodes' group), `workers` (untagged,
//! the only group of `n2`'s instance), `byo-1` and `byo-2` (for the security-group
//! annotations), `elb-shared` (for `ElbSecurityGroup`). Instances `n0` … `n6`; `n6` carries no
//! cluster tag. An ACM certificate and four Elastic IPs.

use crate::kit::*;

/// The cluster ID of the runs against upstream.
pub(crate) const CLUSTER_ID: &str = "diff";
/// `--cluster-name` of both managers (upstream's default).
pub(crate) const CLUSTER_NAME: &str = "kubernetes";
/// The region.
pub(crate) const REGION: &str = "us-east-1";
/// The seed both moto servers of a comparison get.
pub(crate) const SEED: u64 = 4404;

/// One instance of the world.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    /// The `Name` tag (`n0` …).
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) private_dns: String,
    pub(crate) zone: String,
}

impl Instance {
    /// `aws:///<zone>/<id>`.
    pub(crate) fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

/// The IDs of what [`seed`] made, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seeded {
    pub(crate) vpc: String,
    /// Subnet ID by `Name`.
    pub(crate) subnets: BTreeMap<String, String>,
    /// Security-group ID by name.
    pub(crate) groups: BTreeMap<String, String>,
    /// Instances by `Name`.
    pub(crate) instances: BTreeMap<String, Instance>,
    /// Route table ID by name (`main`, `private`).
    pub(crate) tables: BTreeMap<String, String>,
    /// Elastic IP allocation IDs.
    pub(crate) eips: Vec<String>,
    /// An ACM certificate's ARN.
    pub(crate) certificate: String,
}

impl Seeded {
    /// A subnet's ID.
    pub(crate) fn subnet(&self, name: &str) -> &str {
        &self.subnets[name]
    }

    /// An instance.
    pub(crate) fn instance(&self, name: &str) -> &Instance {
        &self.instances[name]
    }

    /// `text` with `{subnet NAME}`, `{sg NAME}`, `{eip N}` and `{cert}` replaced by IDs.
    pub(crate) fn fill(&self, text: &str) -> String {
        let mut out = text.replace("{cert}", &self.certificate);
        for (name, id) in &self.subnets {
            out = out.replace(&format!("{{subnet {name}}}"), id);
        }
        for (name, id) in &self.groups {
            out = out.replace(&format!("{{sg {name}}}"), id);
        }
        for (i, id) in self.eips.iter().enumerate() {
            out = out.replace(&format!("{{eip {i}}}"), id);
        }
        out
    }

    /// Stable names for the seeded IDs, for reading AWS state side by side.
    pub(crate) fn names(&self) -> Vec<(String, String)> {
        let mut out = vec![(self.vpc.clone(), "{vpc}".to_string()), (self.certificate.clone(), "{cert}".to_string())];
        out.extend(self.subnets.iter().map(|(n, id)| (id.clone(), format!("{{subnet {n}}}"))));
        out.extend(self.groups.iter().map(|(n, id)| (id.clone(), format!("{{sg {n}}}"))));
        out.extend(self.instances.values().map(|i| (i.id.clone(), format!("{{{}}}", i.name))));
        out.extend(self.tables.iter().map(|(n, id)| (id.clone(), format!("{{rtb {n}}}"))));
        out.extend(self.eips.iter().enumerate().map(|(i, id)| (id.clone(), format!("{{eip {i}}}"))));
        out
    }
}

fn ec2_tags(kind: ec2::types::ResourceType, tags: &[(String, String)]) -> ec2::types::TagSpecification {
    let mut b = ec2::types::TagSpecification::builder().resource_type(kind);
    for (k, v) in tags {
        b = b.tags(tag(k, v));
    }
    b.build()
}

fn pairs(tags: &[(&str, &str)]) -> Vec<(String, String)> {
    tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The subnets: (name, zone, CIDR, public, tags).
const SUBNETS: [(&str, &str, &str, bool, &[(&str, &str)]); 10] = [
    ("a-elb", "us-east-1a", "10.0.1.0/24", true, &[("{cluster}", "shared"), ("kubernetes.io/role/elb", "1")]),
    ("a-plain", "us-east-1a", "10.0.11.0/24", true, &[]),
    (
        "a-private",
        "us-east-1a",
        "10.0.12.0/24",
        false,
        &[("{cluster}", "shared"), ("kubernetes.io/role/internal-elb", "1")],
    ),
    ("b-elb", "us-east-1b", "10.0.2.0/24", true, &[("{cluster}", "owned"), ("kubernetes.io/role/elb", "")]),
    ("c-untagged", "us-east-1c", "10.0.3.0/24", true, &[]),
    (
        "d-other",
        "us-east-1d",
        "10.0.4.0/24",
        true,
        &[("kubernetes.io/cluster/other", "owned"), ("kubernetes.io/role/elb", "1")],
    ),
    (
        "e-private",
        "us-east-1e",
        "10.0.5.0/24",
        false,
        &[("{cluster}", "shared"), ("kubernetes.io/role/internal-elb", "1")],
    ),
    ("f-one", "us-east-1f", "10.0.6.0/24", true, &[("{cluster}", "shared")]),
    ("f-two", "us-east-1f", "10.0.16.0/24", true, &[("{cluster}", "shared")]),
    ("local", "us-east-1-bos-1a", "10.0.7.0/24", true, &[("{cluster}", "shared"), ("kubernetes.io/role/elb", "1")]),
];

/// The instances: (name, subnet, security group, tagged for the cluster).
const INSTANCES: [(&str, &str, &str, bool); 7] = [
    ("n0", "a-elb", "nodes", true),
    ("n1", "b-elb", "nodes", true),
    ("n2", "c-untagged", "workers", true),
    ("n3", "a-elb", "nodes", true),
    ("n4", "b-elb", "nodes", true),
    ("n5", "f-one", "nodes", true),
    ("n6", "a-elb", "nodes", false),
];

/// Seeds `moto` (seeded with [`SEED`] first) with the world. Every call is made in the same
/// order every time, so two servers seeded alike end with the same IDs.
pub(crate) async fn seed(moto: &Moto, c: &Clients) -> Seeded {
    moto.seed(SEED).await;
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let cluster = |tags: &[(&str, &str)]| -> Vec<(String, String)> {
        tags.iter().map(|(k, v)| (k.replace("{cluster}", &cluster_tag), v.to_string())).collect()
    };
    let mut w = Seeded::default();
    let vpc = c
        .ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .tag_specifications(ec2_tags(ec2::types::ResourceType::Vpc, &pairs(&[("Name", CLUSTER_ID)])))
        .send()
        .await
        .unwrap();
    w.vpc = vpc.vpc.unwrap().vpc_id.unwrap();
    let igw =
        c.ec2.create_internet_gateway().send().await.unwrap().internet_gateway.unwrap().internet_gateway_id.unwrap();
    c.ec2.attach_internet_gateway().internet_gateway_id(&igw).vpc_id(&w.vpc).send().await.unwrap();
    // The main table routes to the internet gateway: subnets without a table of their own are public.
    let main = main_table(c, &w.vpc).await;
    c.ec2
        .create_route()
        .route_table_id(&main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await
        .unwrap();
    w.tables.insert("main".into(), main);
    let private = c
        .ec2
        .create_route_table()
        .vpc_id(&w.vpc)
        .tag_specifications(ec2_tags(ec2::types::ResourceType::RouteTable, &pairs(&[("Name", "private")])))
        .send()
        .await
        .unwrap()
        .route_table
        .unwrap()
        .route_table_id
        .unwrap();
    w.tables.insert("private".into(), private.clone());
    for (name, zone, cidr, public, tags) in SUBNETS {
        let mut tags = cluster(tags);
        tags.push(("Name".into(), name.into()));
        let s = c
            .ec2
            .create_subnet()
            .vpc_id(&w.vpc)
            .cidr_block(cidr)
            .availability_zone(zone)
            .tag_specifications(ec2_tags(ec2::types::ResourceType::Subnet, &tags))
            .send()
            .await
            .unwrap()
            .subnet
            .unwrap()
            .subnet_id
            .unwrap();
        if !public {
            c.ec2.associate_route_table().route_table_id(&private).subnet_id(&s).send().await.unwrap();
        }
        w.subnets.insert(name.into(), s);
    }
    for (name, tags) in [
        ("nodes", cluster(&[("{cluster}", "owned")])),
        ("workers", vec![]),
        ("byo-1", vec![]),
        ("byo-2", vec![]),
        ("elb-shared", vec![]),
    ] {
        let mut b = c.ec2.create_security_group().group_name(name).description(name).vpc_id(&w.vpc);
        if !tags.is_empty() {
            b = b.tag_specifications(ec2_tags(ec2::types::ResourceType::SecurityGroup, &tags));
        }
        w.groups.insert(name.into(), b.send().await.unwrap().group_id.unwrap());
    }
    for (name, subnet, group, tagged) in INSTANCES {
        let mut tags = pairs(&[("Name", name)]);
        if tagged {
            tags.push((cluster_tag.clone(), "owned".into()));
        }
        let r = c
            .ec2
            .run_instances()
            .image_id("ami-12345678")
            .instance_type(ec2::types::InstanceType::T3Medium)
            .min_count(1)
            .max_count(1)
            .subnet_id(&w.subnets[subnet])
            .security_group_ids(&w.groups[group])
            .tag_specifications(ec2_tags(ec2::types::ResourceType::Instance, &tags))
            .send()
            .await
            .unwrap();
        let i = &r.instances()[0];
        w.instances.insert(
            name.into(),
            Instance {
                name: name.into(),
                id: i.instance_id().unwrap().into(),
                private_dns: i.private_dns_name().unwrap().into(),
                zone: i.placement().and_then(|p| p.availability_zone()).unwrap().into(),
            },
        );
    }
    for _ in 0..4 {
        let a = c.ec2.allocate_address().domain(ec2::types::DomainType::Vpc).send().await.unwrap();
        w.eips.push(a.allocation_id.unwrap());
    }
    w.certificate = acm_certificate(moto.port).await;
    w
}

/// A cloud-config as upstream's recipe writes it: the region, the VPC and a subnet (so no
/// metadata service is asked), the cluster ID, `extra` lines for `[Global]`, and every service
/// pointed at `url`.
pub(crate) fn cloud_conf(w: &Seeded, url: &str, extra: &[(&str, &str)]) -> String {
    let mut s = format!(
        "[Global]\nRegion = {REGION}\nZone = {REGION}a\nVPC = {}\nSubnetID = {}\nKubernetesClusterID = {CLUSTER_ID}\n",
        w.vpc,
        w.subnet("a-elb")
    );
    for (k, v) in extra {
        s.push_str(&format!("{k} = {}\n", w.fill(v)));
    }
    s.push_str(&testkit::moto::service_overrides(url, REGION));
    s
}

/// Clients that talk to moto directly (reads of the state, the world's seeding).
pub(crate) async fn direct_clients(url: &str) -> Clients {
    let config = AwsConfig { region: REGION.into(), cluster_id: CLUSTER_ID.into(), ..Default::default() };
    let p = AwsProvider::new(config, CLUSTER_NAME, options_for(url));
    p.clients().await.unwrap().clone()
}
