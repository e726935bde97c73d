//! What a provider honours of a `type: LoadBalancer` Service: KEP-6128's report of the features
//! each implementation supports. A provider describes itself ([`CloudProvider::capabilities`]);
//! the manager serves the report as JSON on `/capabilities`, and docs/provider-capabilities.md
//! carries the built-in providers' reports as a table ([`markdown`]), checked by a test.
//!
//! [`CloudProvider::capabilities`]: crate::provider::CloudProvider::capabilities

use serde::Serialize;

/// How a provider treats a Service field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Support {
    /// Acted on as the Kubernetes API describes it.
    Honoured,
    /// Accepted and not acted on: the Service gets a load balancer, made as if the field were
    /// unset or, where the field asks for something it cannot serve, without it (the note says).
    Ignored,
    /// The Service is refused a load balancer (`Accepted=False`) when it sets the field so.
    Refused,
    /// The provider does not say (the default of a provider that reports nothing).
    Unknown,
}

impl Support {
    /// The word the report uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Support::Honoured => "honoured",
            Support::Ignored => "ignored",
            Support::Refused => "refused",
            Support::Unknown => "unknown",
        }
    }
}

/// A Service field (or value of one) a load balancer may or may not honour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// `spec.ports[].protocol: TCP`.
    TcpPorts,
    /// `spec.ports[].protocol: UDP`.
    UdpPorts,
    /// `spec.ports[].protocol: SCTP`.
    SctpPorts,
    /// TCP and UDP ports on one Service.
    MixedProtocols,
    /// `spec.loadBalancerIP` (deprecated upstream, still read).
    LoadBalancerIp,
    /// `spec.loadBalancerSourceRanges` (and upstream's source-ranges annotation).
    SourceRanges,
    /// `spec.sessionAffinity: ClientIP`.
    SessionAffinity,
    /// `spec.externalTrafficPolicy: Local`, with health checks on `healthCheckNodePort`.
    ExternalTrafficPolicyLocal,
    /// Two `spec.ipFamilies`: an address of each family.
    DualStack,
    /// `spec.allocateLoadBalancerNodePorts: false`.
    NoNodePorts,
    /// `status.loadBalancer.ingress[].ipMode: Proxy`.
    IpModeProxy,
}

impl Feature {
    /// Every feature, in report order.
    pub const ALL: [Feature; 11] = [
        Feature::TcpPorts,
        Feature::UdpPorts,
        Feature::SctpPorts,
        Feature::MixedProtocols,
        Feature::LoadBalancerIp,
        Feature::SourceRanges,
        Feature::SessionAffinity,
        Feature::ExternalTrafficPolicyLocal,
        Feature::DualStack,
        Feature::NoNodePorts,
        Feature::IpModeProxy,
    ];

    /// The field (or value) it is about, as the report names it.
    pub fn field(self) -> &'static str {
        match self {
            Feature::TcpPorts => "spec.ports[].protocol=TCP",
            Feature::UdpPorts => "spec.ports[].protocol=UDP",
            Feature::SctpPorts => "spec.ports[].protocol=SCTP",
            Feature::MixedProtocols => "spec.ports[].protocol (TCP and UDP on one Service)",
            Feature::LoadBalancerIp => "spec.loadBalancerIP",
            Feature::SourceRanges => "spec.loadBalancerSourceRanges",
            Feature::SessionAffinity => "spec.sessionAffinity=ClientIP",
            Feature::ExternalTrafficPolicyLocal => "spec.externalTrafficPolicy=Local",
            Feature::DualStack => "spec.ipFamilies (two families)",
            Feature::NoNodePorts => "spec.allocateLoadBalancerNodePorts=false",
            Feature::IpModeProxy => "status.loadBalancer.ingress[].ipMode=Proxy",
        }
    }
}

impl Serialize for Feature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.field())
    }
}

/// How one field is treated, with a short note (what the provider does, a condition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldSupport {
    /// The field.
    pub field: Feature,
    /// How it is treated.
    pub support: Support,
    /// What the provider does with it; may be empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// An annotation the provider reads on a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnnotationSupport {
    /// The annotation's key.
    pub name: String,
    /// What it asks for.
    pub note: String,
}

/// What the provider's load balancers honour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerCapabilities {
    /// One entry per [`Feature`], in [`Feature::ALL`]'s order.
    pub fields: Vec<FieldSupport>,
    /// The annotations it reads, sorted by name.
    pub annotations: Vec<AnnotationSupport>,
    /// Whether it lists the cloud objects it owns, so the manager can report (and on request
    /// delete) those no Service has any more (`LoadBalancer::list_owned`).
    pub orphans: bool,
}

impl LoadBalancerCapabilities {
    /// A report that says nothing: every field [`Support::Unknown`], no annotations, no orphan
    /// listing. Providers that do not describe themselves report this.
    pub fn unreported() -> Self {
        Self::from_fields(Feature::ALL.iter().map(|f| (*f, Support::Unknown, "")))
    }

    /// A report from `(feature, support, note)` triples; features left out are
    /// [`Support::Unknown`]. Annotations and orphan listing start empty.
    pub fn from_fields<'a>(fields: impl IntoIterator<Item = (Feature, Support, &'a str)>) -> Self {
        let given: Vec<(Feature, Support, &str)> = fields.into_iter().collect();
        let fields = Feature::ALL
            .iter()
            .map(|f| match given.iter().find(|(g, _, _)| g == f) {
                Some((_, support, note)) => FieldSupport { field: *f, support: *support, note: note.to_string() },
                None => FieldSupport { field: *f, support: Support::Unknown, note: String::new() },
            })
            .collect();
        Self { fields, annotations: Vec::new(), orphans: false }
    }

    /// Add the annotations the provider reads (kept sorted by name).
    pub fn with_annotations<'a>(mut self, annotations: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        self.annotations
            .extend(annotations.into_iter().map(|(n, d)| AnnotationSupport { name: n.into(), note: d.into() }));
        self.annotations.sort_by(|a, b| a.name.cmp(&b.name));
        self.annotations.dedup_by(|a, b| a.name == b.name);
        self
    }

    /// Say whether the provider lists the objects it owns.
    pub fn with_orphans(mut self, orphans: bool) -> Self {
        self.orphans = orphans;
        self
    }

    /// How `feature` is treated.
    pub fn support(&self, feature: Feature) -> Support {
        self.fields.iter().find(|f| f.field == feature).map_or(Support::Unknown, |f| f.support)
    }
}

/// A provider's report: which controllers it serves and what its load balancers honour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// The provider's registered name.
    pub provider: String,
    /// Whether it looks instances up (the node and lifecycle controllers run).
    pub instances: bool,
    /// Whether it programs pod-network routes (the route controller runs).
    pub routes: bool,
    /// Its load balancers; `None` when it has none (the service controller does not run).
    pub load_balancer: Option<LoadBalancerCapabilities>,
}

/// The JSON `/capabilities` answers with.
pub fn to_json(capabilities: &Capabilities) -> String {
    // Serializing these plain types cannot fail; an empty object stands in if it ever did.
    serde_json::to_string_pretty(capabilities).unwrap_or_else(|_| "{}".to_string())
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The Markdown of docs/provider-capabilities.md's generated part: one table of the fields
/// (a column per provider), then each provider's annotations.
pub fn markdown(reports: &[Capabilities]) -> String {
    let mut out = String::new();
    out.push_str("| Service field |");
    for r in reports {
        out.push_str(&format!(" `{}` |", r.provider));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(reports.len()));
    out.push('\n');
    for feature in Feature::ALL {
        out.push_str(&format!("| `{}` |", cell(feature.field())));
        for r in reports {
            let text = match &r.load_balancer {
                None => "no load balancers".to_string(),
                Some(lb) => {
                    let f = lb.fields.iter().find(|f| f.field == feature);
                    match f {
                        Some(f) if !f.note.is_empty() => format!("{}: {}", f.support.as_str(), f.note),
                        Some(f) => f.support.as_str().to_string(),
                        None => Support::Unknown.as_str().to_string(),
                    }
                }
            };
            out.push_str(&format!(" {} |", cell(&text)));
        }
        out.push('\n');
    }
    out.push_str("| orphan report and sweep |");
    for r in reports {
        let text = match &r.load_balancer {
            Some(lb) if lb.orphans => "yes",
            Some(_) => "no",
            None => "no load balancers",
        };
        out.push_str(&format!(" {text} |"));
    }
    out.push('\n');
    for r in reports {
        let Some(lb) = &r.load_balancer else { continue };
        out.push_str(&format!("\n### `{}`: annotations\n\n", r.provider));
        if lb.annotations.is_empty() {
            out.push_str("None.\n");
            continue;
        }
        out.push_str("| Annotation | What it asks for |\n|---|---|\n");
        for a in &lb.annotations {
            out.push_str(&format!("| `{}` | {} |\n", cell(&a.name), cell(&a.note)));
        }
    }
    out
}

/// The marker lines around the generated part of docs/provider-capabilities.md.
pub const MARKERS: (&str, &str) = (
    "<!-- generated by `CCM_UPDATE_DOCS=1 cargo test -p ccm-builtin capabilities`: do not edit -->",
    "<!-- end of generated part -->",
);

/// `doc` with its generated part (between [`MARKERS`]) replaced by `generated`; `None` when the
/// markers are missing.
pub fn splice(doc: &str, generated: &str) -> Option<String> {
    let start = doc.find(MARKERS.0)? + MARKERS.0.len();
    let end = start + doc[start..].find(MARKERS.1)?;
    Some(format!("{}\n\n{}\n{}", &doc[..start], generated.trim_end(), &doc[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Capabilities {
        let lb = LoadBalancerCapabilities::from_fields([
            (Feature::TcpPorts, Support::Honoured, ""),
            (Feature::SctpPorts, Support::Refused, "UnsupportedService"),
        ])
        .with_annotations([("example.com/b", "second"), ("example.com/a", "first | with a pipe")])
        .with_orphans(true);
        Capabilities { provider: "demo".into(), instances: true, routes: false, load_balancer: Some(lb) }
    }

    #[test]
    fn fields_left_out_are_unknown_and_every_feature_has_one_entry_in_order() {
        let lb = report().load_balancer.unwrap();
        assert_eq!(lb.fields.len(), Feature::ALL.len());
        assert_eq!(lb.support(Feature::TcpPorts), Support::Honoured);
        assert_eq!(lb.support(Feature::UdpPorts), Support::Unknown);
        let order: Vec<Feature> = lb.fields.iter().map(|f| f.field).collect();
        assert_eq!(order, Feature::ALL);
        assert_eq!(lb.annotations[0].name, "example.com/a", "sorted");
        assert!(LoadBalancerCapabilities::unreported().fields.iter().all(|f| f.support == Support::Unknown));
    }

    #[test]
    fn the_json_names_fields_by_their_path_and_support_in_lower_case() {
        let v: serde_json::Value = serde_json::from_str(&to_json(&report())).unwrap();
        assert_eq!(v["provider"], "demo");
        assert_eq!(v["loadBalancer"]["fields"][0]["field"], "spec.ports[].protocol=TCP");
        assert_eq!(v["loadBalancer"]["fields"][0]["support"], "honoured");
        assert_eq!(v["loadBalancer"]["fields"][2]["note"], "UnsupportedService");
        assert!(v["loadBalancer"]["fields"][1].get("note").is_none(), "empty notes are left out");
        assert_eq!(v["loadBalancer"]["orphans"], true);
    }

    #[test]
    fn the_markdown_has_a_row_per_feature_and_escapes_pipes() {
        let md = markdown(&[report()]);
        assert!(md.starts_with("| Service field | `demo` |\n|---|---|\n"), "{md}");
        assert!(md.contains("| `spec.ports[].protocol=SCTP` | refused: UnsupportedService |"), "{md}");
        assert!(md.contains("| `example.com/a` | first \\| with a pipe |"), "{md}");
        assert!(md.contains("| orphan report and sweep | yes |"), "{md}");
        let rows = md.lines().filter(|l| l.starts_with("| `spec.") || l.starts_with("| `status.")).count();
        assert_eq!(rows, Feature::ALL.len());
    }

    #[test]
    fn splicing_replaces_only_the_generated_part() {
        let doc = format!("intro\n{}\nold table\n{}\noutro\n", MARKERS.0, MARKERS.1);
        let out = splice(&doc, "new table\n").unwrap();
        assert_eq!(out, format!("intro\n{}\n\nnew table\n{}\noutro\n", MARKERS.0, MARKERS.1));
        assert_eq!(splice(&out, "new table\n").unwrap(), out, "idempotent");
        assert_eq!(splice("no markers", "x"), None);
    }
}
