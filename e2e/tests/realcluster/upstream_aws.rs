//! Issue 48 on the real cluster with upstream cloud-provider-aws: its own binary
//! (`../shared/upstream-aws`, v1.36.1) as an image under a `CloudControllerManager`
//! (`spec.upstream.profile: aws`), against moto on the cluster's segment. It initializes Nodes
//! named as moto's instances, makes an NLB for a Service and rolls on a credentials rotation;
//! then one edit (removing `spec.upstream`) hands the resource to the Rust `aws` manager, which
//! takes the NLB over as it is. Measured: the longest time the Lease had no fresh holder.
//! moto answers over HTTPS with a certificate of the scenario's own CA, which both managers
//! trust only through `spec.cloudConfig.caBundleKey`.
//!
//! The kubelets' Nodes (`node-1`..`node-3`) are no EC2 instances: they are kept out of the
//! load balancer (`node.kubernetes.io/exclude-from-external-load-balancers`) for the scenario,
//! and two Nodes named by the instances' private DNS names stand for the cluster's machines.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use e2e::realcluster::{holders, images};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::multinode::{initialized, measured};
use crate::upstream_image::{
    condition_of, imported, pods_of, ready_with_leader_of, resource_named,
    upstream_images_allowed_and_no_other_resource,
};
use crate::{CCM_NS, Ctx, apply, wait};

const NAME: &str = "aws";
const SECRET: &str = "aws-cloud-config";
const LB_NS: &str = "aws-lb";
const CLUSTER_ID: &str = "ccm-e2e";
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const FIELD_MANAGER: &str = "realcluster-e2e";

/// moto, corrected as the aws suite runs it, on the host's segment address over HTTPS with a
/// certificate of the scenario's own CA (the managers trust it through `caBundleKey`); killed
/// on drop.
struct Moto {
    child: Child,
    url: String,
    /// The CA's PEM, and where it is on the host (for curl and boto3).
    ca: String,
    ca_file: std::path::PathBuf,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    async fn start(ctx: &Ctx) -> Moto {
        let host = ctx.cluster.network.segment_address(1);
        let port = std::net::TcpListener::bind((host, 0)).and_then(|l| l.local_addr()).expect("a free port").port();
        let dir = ctx.cluster.state_dir().join("moto");
        std::fs::create_dir_all(&dir).expect("moto's directory");
        let tls = testkit::tls::serving_for(&[host.into()]).expect("a CA and moto's certificate");
        let (cert, key, ca_file) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        for (path, pem) in [(&cert, &tls.cert), (&key, &tls.key), (&ca_file, &tls.ca)] {
            std::fs::write(path, pem).expect("writing moto's TLS files");
        }
        let log = std::fs::File::create(dir.join("moto.log")).expect("moto's log");
        let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
        let child = Command::new("python3")
            .args(["-c", testkit::moto::CORRECTIONS, "-H", &host.to_string(), "-p", &port.to_string()])
            .args(["-c", &cert_arg, "-k", &key_arg])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("python3 runs moto");
        let moto = Moto { child, url: format!("https://{host}:{port}"), ca: tls.ca, ca_file };
        let url = format!("{}/moto-api/", moto.url);
        let ca_arg = moto.ca_file.display().to_string();
        wait("moto answering over TLS", Duration::from_secs(30), || async {
            let ok = Command::new("curl")
                .args(["-sf", "--cacert", &ca_arg, "-o", "/dev/null", &url])
                .status()
                .is_ok_and(|s| s.success());
            ok.then_some(())
        })
        .await;
        moto
    }

    /// Runs a boto3 script against this moto; its standard output as JSON.
    fn python(&self, script: &str, args: &[&str]) -> Value {
        let out = Command::new("python3")
            .args(["-c", script, &self.url])
            .args(args)
            .env("AWS_CA_BUNDLE", &self.ca_file)
            .output()
            .expect("python3 runs boto3");
        assert!(out.status.success(), "boto3 script failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("the script prints JSON")
    }
}

/// A cluster-shaped VPC (`../shared/upstream-aws/moto_setup.py`'s layout): two tagged subnets,
/// a Nodes' security group and two instances; printed as JSON.
const SETUP: &str = r#"
import json, sys, boto3
endpoint, cluster = sys.argv[1], sys.argv[2]
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint,
                   aws_access_key_id="testing", aws_secret_access_key="testing")
tag = {"Key": "kubernetes.io/cluster/" + cluster, "Value": "owned"}
vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
ec2.create_tags(Resources=[vpc], Tags=[tag])
igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
rt = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
ec2.create_route(RouteTableId=rt, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
sg = ec2.create_security_group(GroupName=cluster + "-node", Description="nodes", VpcId=vpc)["GroupId"]
ec2.create_tags(Resources=[sg], Tags=[tag])
ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
subnets, instances = [], []
for i, az in enumerate(["us-east-1a", "us-east-1b"]):
    sn = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.%d.0/24" % (i + 1), AvailabilityZone=az)["Subnet"]["SubnetId"]
    ec2.create_tags(Resources=[sn], Tags=[tag, {"Key": "kubernetes.io/role/elb", "Value": "1"}])
    ec2.associate_route_table(RouteTableId=rt, SubnetId=sn)
    subnets.append(sn)
    inst = ec2.run_instances(ImageId=ami, InstanceType="t3.medium", MinCount=1, MaxCount=1, SubnetId=sn,
                             SecurityGroupIds=[sg],
                             TagSpecifications=[{"ResourceType": "instance", "Tags": [tag]}])["Instances"][0]
    instances.append({"id": inst["InstanceId"], "az": az, "privateDns": inst["PrivateDnsName"]})
print(json.dumps({"vpc": vpc, "subnets": subnets, "nodeSG": sg, "instances": instances}))
"#;

/// What moto holds of load balancers: each NLB with its listeners and target groups, and the
/// Nodes' group's rules; printed as JSON, sorted.
const SNAPSHOT: &str = r#"
import json, sys, boto3
endpoint, sg = sys.argv[1], sys.argv[2]
kw = dict(region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing")
elb, ec2 = boto3.client("elbv2", **kw), boto3.client("ec2", **kw)
out = {"loadBalancers": [], "rules": []}
for lb in elb.describe_load_balancers()["LoadBalancers"]:
    arn = lb["LoadBalancerArn"]
    listeners = sorted((l["ListenerArn"], l["Port"], l["Protocol"], json.dumps(l["DefaultActions"], sort_keys=True))
                       for l in elb.describe_listeners(LoadBalancerArn=arn)["Listeners"])
    groups = sorted((g["TargetGroupArn"], g["Port"], g["Protocol"])
                    for g in elb.describe_target_groups(LoadBalancerArn=arn)["TargetGroups"])
    out["loadBalancers"].append({"arn": arn, "dns": lb["DNSName"], "created": str(lb["CreatedTime"]),
                                 "listeners": listeners, "targetGroups": groups})
for p in ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]:
    out["rules"].append(json.dumps(p, sort_keys=True))
out["rules"].sort()
print(json.dumps(out))
"#;

fn cloud_config(moto: &str, vpc: &str, subnet: &str) -> String {
    format!(
        "[Global]\nRegion = us-east-1\nZone = us-east-1a\nVPC = {vpc}\nSubnetID = {subnet}\nKubernetesClusterID = {CLUSTER_ID}\n{}",
        testkit::moto::service_overrides(moto, "us-east-1")
    )
}

fn secret(config: &str, ca: &str, key_id: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": CCM_NS,
            "labels": {crds::CLOUD_CONFIG_LABEL: crds::CLOUD_CONFIG_LABEL_VALUE}},
        "stringData": {"cloud.conf": config, "ca.crt": ca,
            "credentials": format!("[default]\naws_access_key_id = {key_id}\naws_secret_access_key = testing\n")}})
}

/// The Lease's holders as seen every 100 ms: `(when, holder, renewTime)`.
type Samples = Arc<Mutex<Vec<holders::Sample>>>;

fn sample_lease(ctx: &Ctx, samples: Samples) -> tokio::task::JoinHandle<()> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    tokio::spawn(async move {
        loop {
            if let Ok(Some(l)) = leases.get_opt(NAME).await {
                let spec = l.spec.unwrap_or_default();
                let renew = spec.renew_time.map(|t| SystemTime::from(t.0));
                let holder = spec.holder_identity.unwrap_or_default();
                if let Ok(mut s) = samples.lock() {
                    s.push((SystemTime::now(), holder, renew));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Issue 48's acceptance for upstream cloud-provider-aws, and the one-edit switch.
pub async fn an_upstream_aws_image_makes_an_nlb_and_one_edit_hands_it_to_the_rust_manager(ctx: Arc<Ctx>) {
    let has_moto =
        Command::new("python3").args(["-c", "import moto.server, boto3"]).status().is_ok_and(|s| s.success());
    if !has_moto {
        println!("    skipped: moto is not installed (pip install 'moto[server]==5.2.5')");
        return;
    }
    let found = e2e::upstream::aws_binary();
    if !imported(&ctx, found, "upstream cloud-provider-aws", "upstream-aws", images::build_upstream_aws) {
        return;
    }
    upstream_images_allowed_and_no_other_resource(&ctx).await;

    let moto = Moto::start(&ctx).await;
    let world = moto.python(SETUP, &[CLUSTER_ID]);
    let (vpc, subnet, sg) = (
        world["vpc"].as_str().expect("vpc"),
        world["subnets"][0].as_str().expect("subnet"),
        world["nodeSG"].as_str().expect("group"),
    );
    let config = cloud_config(&moto.url, vpc, subnet);

    // Earlier scenarios' LoadBalancer Services would become Classic ELBs here (both managers
    // take every Service of no class): they are the earlier scenarios' leftovers, and go.
    let all_services: Api<Service> = Api::all(ctx.client.clone());
    let leftovers: Vec<Service> = all_services
        .list(&Default::default())
        .await
        .expect("listing Services")
        .items
        .into_iter()
        .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
        .collect();
    for svc in &leftovers {
        let ns = svc.namespace().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        // No manager runs to remove the cleanup finalizer of the one that made its address.
        let unfinalized = json!({"metadata": {"finalizers": null}});
        let _ = api.patch(&svc.name_any(), &PatchParams::default(), &Patch::Merge(&unfinalized)).await;
        let _ = api.delete(&svc.name_any(), &DeleteParams::default()).await;
    }
    wait("no LoadBalancer Service left by earlier scenarios", Duration::from_secs(60), || async {
        let list = all_services.list(&Default::default()).await.ok()?;
        let left = list.items.iter().any(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"));
        (!left).then_some(())
    })
    .await;

    // The kubelets' Nodes stay out of the load balancer; two Nodes stand for the instances.
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let kubelet_nodes = ctx.cluster.node_names();
    let label = |value: Value| json!({"metadata": {"labels": {EXCLUDE: value}}});
    for n in &kubelet_nodes {
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(label(json!("")))).await.expect("label a Node");
    }
    let instances: Vec<(String, String, String)> = world["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap_or_default().to_string();
            (s("privateDns"), s("id"), s("az"))
        })
        .collect();
    for (dns, _, _) in &instances {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": dns, "labels": {"kubernetes.io/hostname": dns}},
            "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]}});
        let node: Node = serde_json::from_value(node).expect("a Node");
        nodes.create(&Default::default(), &node).await.expect("create a Node for an instance");
    }

    // The resource on upstream's image.
    apply(&ctx.client, secret(&config, &moto.ca, "testing")).await;
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": NAME, "namespace": CCM_NS},
            "spec": {"provider": "aws", "upstream": {"profile": "aws"},
                "cloudConfig": {"secretRef": {"name": SECRET, "key": "cloud.conf"}, "credentialsKey": "credentials", "caBundleKey": "ca.crt"},
                "controllers": ["*"], "configureCloudRoutes": false, "clusterName": CLUSTER_ID,
                "deployment": {"image": images::UPSTREAM_AWS, "imagePullPolicy": "Never", "replicas": 2}}}),
    )
    .await;
    let leader = ready_with_leader_of(&ctx, NAME, "upstream aws Ready with its leader named").await;
    measured(format!(
        "upstream aws image: resource applied to Ready with leader {leader}: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    leader_manager_is(&ctx, "upstream/aws").await;
    let (status, reason) = condition_of(&ctx, NAME, "ProviderHealthy").await.expect("ProviderHealthy");
    assert_eq!((status.as_str(), reason.as_str()), ("True", crds::reasons::provider_healthy::UPSTREAM_HEALTHZ));

    for (dns, id, az) in &instances {
        let node =
            wait(&format!("{dns} initialized by upstream aws"), Duration::from_secs(120), || initialized(&ctx, dns))
                .await;
        assert_eq!(node.spec.and_then(|s| s.provider_id).as_deref(), Some(format!("aws:///{az}/{id}").as_str()));
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("t3.medium"));
    }
    measured(format!(
        "upstream aws image: both instances' Nodes initialized {:.1} s after apply",
        t.elapsed().as_secs_f64()
    ));

    // An NLB for a Service.
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LB_NS}})).await;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), LB_NS);
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": LB_NS,
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 80}]}}),
    )
    .await;
    let hostname = wait("the NLB's hostname on the Service", Duration::from_secs(120), || async {
        services.get_opt("web").await.ok()??.status?.load_balancer?.ingress?.first()?.hostname.clone()
    })
    .await;
    measured(format!("upstream aws image: Service to NLB {hostname}: {:.1} s", t.elapsed().as_secs_f64()));
    let first = moto.python(SNAPSHOT, &[sg]);
    assert_eq!(first["loadBalancers"].as_array().map(Vec::len), Some(1), "one NLB: {first}");

    // A credentials rotation rolls the Pods.
    let rolled: Vec<String> = pods_of(&ctx, NAME).await.iter().map(|p| p.name_any()).collect();
    let t = Instant::now();
    apply(&ctx.client, secret(&config, &moto.ca, "rotated")).await;
    wait("upstream aws Pods replaced after the credentials rotation", Duration::from_secs(180), || async {
        let now = pods_of(&ctx, NAME).await;
        let fresh = now.iter().filter(|p| !rolled.contains(&p.name_any()) && crate::is_ready(p)).count();
        (fresh == 2 && now.len() == 2).then_some(())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    // Upstream does not give its Lease up when stopped: a new Pod takes it when it expires.
    wait("a new upstream Pod holding the Lease", Duration::from_secs(120), || async {
        let holder = leases.get_opt(NAME).await.ok()??.spec?.holder_identity?;
        (holder != leader).then_some(())
    })
    .await;
    let leader = ready_with_leader_of(&ctx, NAME, "upstream aws Ready after the rotation").await;
    measured(format!(
        "upstream aws image: credentials rotation to new Pods Ready and a new leader {leader}: {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    // What upstream left, once its new leader has synced everything: the switch must keep it.
    let before = moto.python(SNAPSHOT, &[sg]);
    assert_eq!(before["loadBalancers"], first["loadBalancers"], "the rotation kept the NLB");

    // One edit: the Rust manager.
    let edit = json!({"spec": {"upstream": null, "deployment": {"image": null}}});
    let rust_leader = switch(&ctx, &edit, &leader, "the Rust manager", images::MANAGER).await;
    leader_manager_is(&ctx, "cloud-controller-manager").await;
    let after = moto.python(SNAPSHOT, &[sg]);
    assert_eq!(before, after, "the NLB, its listeners, target groups and the Nodes' rules as upstream left them");
    // And back: upstream's image takes over what the Rust manager kept.
    let edit = json!({"spec": {"upstream": {"profile": "aws"}, "deployment": {"image": images::UPSTREAM_AWS}}});
    switch(&ctx, &edit, &rust_leader, "upstream's image", images::UPSTREAM_AWS).await;
    leader_manager_is(&ctx, "upstream/aws").await;
    let back = moto.python(SNAPSHOT, &[sg]);
    assert_eq!(before, back, "the NLB as it was, after the switch back");
    let hostname_after = services
        .get_opt("web")
        .await
        .ok()
        .flatten()
        .and_then(|s| s.status?.load_balancer?.ingress?.first()?.hostname.clone());
    assert_eq!(hostname_after.as_deref(), Some(hostname.as_str()));

    // The manager deletes the NLB with the Service.
    let _ = services.delete("web", &DeleteParams::default()).await;
    wait("the Service gone through the manager's finalizer", Duration::from_secs(120), || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    let empty = moto.python(SNAPSHOT, &[sg]);
    assert_eq!(empty["loadBalancers"].as_array().map(Vec::len), Some(0), "{empty}");

    // Nothing of the scenario stays.
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(NAME, &DeleteParams::default()).await;
    wait("the aws resource and its Pods gone", Duration::from_secs(120), || async {
        (resource_named(&ctx, NAME).await.is_none() && pods_of(&ctx, NAME).await.is_empty()).then_some(())
    })
    .await;
    for (dns, _, _) in &instances {
        let _ = nodes.delete(dns, &DeleteParams::default()).await;
    }
    for n in &kubelet_nodes {
        let _ = nodes.patch(n, &PatchParams::default(), &Patch::Merge(label(Value::Null))).await;
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = secrets.delete(SECRET, &DeleteParams::default()).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let _ = namespaces.delete(LB_NS, &DeleteParams::default()).await;
    drop(moto);
}

/// Applies `edit` to the resource and waits until a new holder (not `from`) leads and has
/// synced the Service since; measures the edit to that, and the longest time no holder renewed
/// the Lease. Returns the new leader.
async fn switch(ctx: &Ctx, edit: &Value, from: &str, to: &str, image: &str) -> String {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let samples: Samples = Arc::default();
    let sampler = sample_lease(ctx, samples.clone());
    let t = Instant::now();
    crs.patch(NAME, &PatchParams::apply(FIELD_MANAGER), &Patch::Merge(edit)).await.expect("the one edit");
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), LB_NS);
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), LB_NS);
    let leader = wait(&format!("{to} leading"), Duration::from_secs(240), || async {
        let holder = leases.get_opt(NAME).await.ok()??.spec?.holder_identity?;
        (holder != from && holder_image(ctx, &holder).await?.starts_with(image)).then_some(holder)
    })
    .await;
    // A Service edit makes whoever leads sync it; both managers name the Service in an Event.
    let poke = json!({"metadata": {"annotations": {"e2e.ccm.rs/switched-to": to}}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&poke)).await.expect("a Service edit");
    let poked = SystemTime::now();
    wait(&format!("{to} ensuring the NLB"), Duration::from_secs(120), || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                // Repeats are counted on the first one: the latest of its times.
                let at = [
                    e.event_time.as_ref().map(|t| t.0),
                    e.series.as_ref().map(|s| s.last_observed_time.0),
                    e.deprecated_last_timestamp.as_ref().map(|t| t.0),
                ]
                .into_iter()
                .flatten()
                .max()
                .map(SystemTime::from);
                e.reason.as_deref() == Some("EnsuredLoadBalancer")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                    && at.is_some_and(|at| at + Duration::from_secs(1) >= poked)
            })
            .then_some(())
    })
    .await;
    measured(format!(
        "switch to {to}: edit to its leader {leader} ensuring the NLB: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    sampler.abort();
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let gap = holders::longest_gap(&samples);
    measured(format!(
        "switch to {to}: longest time no holder renewed the Lease (every controller): {:.1} s; two holders at once: never (one Lease); holders: {}",
        gap.as_secs_f64(),
        holders::sequence(&samples).join(" -> ")
    ));
    assert_eq!(ready_with_leader_of(ctx, NAME, &format!("{to} Ready")).await, leader);
    for p in pods_of(ctx, NAME).await {
        let log = ctx.cluster.kubectl_raw(&["logs", "-n", CCM_NS, &p.name_any()]).expect("the manager's log");
        assert!(!log.contains("forbidden"), "{}: a forbidden request", p.name_any());
    }
    leader
}

/// The image of the manager Pod a Lease holder runs in: a host-network manager's identity starts
/// with its Node's name, and one manager Pod fits on a Node (its port).
async fn holder_image(ctx: &Ctx, holder: &str) -> Option<String> {
    let node = holder.split('_').next()?;
    let pods = pods_of(ctx, NAME).await;
    let pod = pods.iter().find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))?;
    pod.spec.as_ref()?.containers.first()?.image.clone()
}

/// Waits until `status.leaderManager` names `manager`.
async fn leader_manager_is(ctx: &Ctx, manager: &str) {
    wait(&format!("status.leaderManager {manager}"), Duration::from_secs(30), || async {
        let named = resource_named(ctx, NAME).await?.status?.leader_manager?;
        (named == manager).then_some(())
    })
    .await;
}
