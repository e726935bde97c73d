//! Service defaults and allocation of cluster IPs and node ports.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::error::Cause;

/// Allocates cluster IPs from a /N range and node ports from a port range, without duplicates.
#[derive(Debug)]
pub(crate) struct Allocator {
    base: u32,
    size: u32,
    next_ip: u32,
    used_ips: HashSet<u32>,
    ports: (u16, u16),
    next_port: u16,
    used_ports: HashSet<(u16, String)>,
}

/// What a prepared create/update allocated (to roll back on failure or dry run).
#[derive(Debug, Default)]
pub(crate) struct Allocated {
    ips: Vec<u32>,
    ports: Vec<(u16, String)>,
}

impl Allocator {
    pub fn new(base: Ipv4Addr, prefix_len: u8, ports: (u16, u16)) -> Self {
        let size = if prefix_len >= 32 { 1 } else { 1u32 << (32 - u32::from(prefix_len)) };
        let base = u32::from(base) & !(size.wrapping_sub(1));
        Allocator {
            base,
            size,
            next_ip: 2,
            used_ips: HashSet::new(),
            ports,
            next_port: ports.0,
            used_ports: HashSet::new(),
        }
    }

    fn ip_offset(&self, ip: &str) -> Option<u32> {
        let ip: Ipv4Addr = ip.parse().ok()?;
        let off = u32::from(ip).wrapping_sub(self.base);
        (off < self.size).then_some(off)
    }

    fn alloc_ip(&mut self) -> Option<u32> {
        // Skip the network and broadcast addresses, and the first address, which a real cluster
        // reserves for `default/kubernetes`.
        for _ in 0..self.size {
            let off = self.next_ip;
            self.next_ip = if self.next_ip + 2 >= self.size { 2 } else { self.next_ip + 1 };
            if off > 1 && off != self.size - 1 && self.used_ips.insert(off) {
                return Some(off);
            }
        }
        None
    }

    fn alloc_port(&mut self, protocol: &str) -> Option<u16> {
        let span = u32::from(self.ports.1 - self.ports.0) + 1;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if self.next_port >= self.ports.1 { self.ports.0 } else { self.next_port + 1 };
            if self.used_ports.insert((p, protocol.to_string())) {
                return Some(p);
            }
        }
        None
    }

    /// Gives back what a failed or dry-run write allocated.
    pub fn rollback(&mut self, a: Allocated) {
        for ip in a.ips {
            self.used_ips.remove(&ip);
        }
        for p in a.ports {
            self.used_ports.remove(&p);
        }
    }

    /// Frees a deleted Service's IP and ports.
    pub fn release(&mut self, svc: &Value) {
        if let Some(off) = svc.pointer("/spec/clusterIP").and_then(Value::as_str).and_then(|ip| self.ip_offset(ip)) {
            self.used_ips.remove(&off);
        }
        for (port, proto) in node_ports(svc) {
            self.used_ports.remove(&(port, proto));
        }
        if let Some(p) = svc.pointer("/spec/healthCheckNodePort").and_then(Value::as_u64) {
            self.used_ports.remove(&(p as u16, "TCP".to_string()));
        }
    }

    /// Re-registers an existing Service's allocations (used when restoring state).
    pub fn prepare(&mut self, old: Option<&Value>, svc: &mut Value) -> Result<Allocated, Vec<Cause>> {
        let mut done = Allocated::default();
        match self.prepare_inner(old, svc, &mut done) {
            Ok(()) => Ok(done),
            Err(causes) => {
                self.rollback(done);
                Err(causes)
            }
        }
    }

    fn prepare_inner(&mut self, old: Option<&Value>, svc: &mut Value, done: &mut Allocated) -> Result<(), Vec<Cause>> {
        let ty = svc.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP").to_string();
        if let Some(old) = old {
            drop_type_dependent_fields(old, svc, &ty);
        }
        default_service(svc);
        let mut causes = vec![];

        // Cluster IP: keep the old one on update, allocate or validate on create.
        let old_ip = old.and_then(|o| o.pointer("/spec/clusterIP")).and_then(Value::as_str).map(String::from);
        let wanted = svc.pointer("/spec/clusterIP").and_then(Value::as_str).map(String::from);
        if ty == "ExternalName" {
            if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("clusterIP");
                spec.remove("clusterIPs");
            }
        } else {
            let ip = match (&old_ip, &wanted) {
                (Some(o), None) => Some(o.clone()),
                (Some(o), Some(w)) if o == w || w.is_empty() => Some(o.clone()),
                (Some(o), Some(w)) => {
                    causes.push(Cause::invalid("spec.clusterIP", &json!(w), &format!("field is immutable (was {o})")));
                    None
                }
                (None, Some(w)) if w == "None" => Some("None".to_string()),
                (None, Some(w)) if !w.is_empty() => match self.ip_offset(w) {
                    Some(off) if self.used_ips.insert(off) => {
                        done.ips.push(off);
                        Some(w.clone())
                    }
                    Some(_) => {
                        causes.push(Cause::invalid("spec.clusterIP", &json!(w), "provided IP is already allocated"));
                        None
                    }
                    None => {
                        causes.push(Cause::invalid(
                            "spec.clusterIP",
                            &json!(w),
                            "provided IP is not in the valid range",
                        ));
                        None
                    }
                },
                (None, _) => match self.alloc_ip() {
                    Some(off) => {
                        done.ips.push(off);
                        Some(Ipv4Addr::from(self.base + off).to_string())
                    }
                    None => {
                        causes.push(Cause::invalid("spec.clusterIP", &Value::Null, "range is full"));
                        None
                    }
                },
            };
            if let (Some(ip), Some(spec)) = (ip, svc.get_mut("spec").and_then(Value::as_object_mut)) {
                spec.insert("clusterIPs".into(), json!([ip]));
                spec.insert("clusterIP".into(), json!(ip));
            }
        }

        // Node ports: keep old ones for the same port, allocate missing ones, reject duplicates.
        let wants_node_ports = ty == "NodePort"
            || (ty == "LoadBalancer"
                && svc.pointer("/spec/allocateLoadBalancerNodePorts").and_then(Value::as_bool) != Some(false));
        let old_ports: Vec<(i64, String, u16)> = old
            .and_then(|o| o.pointer("/spec/ports"))
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        Some((p.get("port")?.as_i64()?, protocol(p), u16::try_from(p.get("nodePort")?.as_u64()?).ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let old_set: HashSet<(u16, String)> = old.map(node_ports).unwrap_or_default().into_iter().collect();
        let mut seen: HashSet<(u16, String)> = HashSet::new();
        if let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for (i, p) in ports.iter_mut().enumerate() {
                let proto = protocol(p);
                let field = format!("spec.ports[{i}].nodePort");
                let given = p.get("nodePort").and_then(Value::as_u64).filter(|n| *n != 0);
                if !wants_node_ports {
                    if given.is_some() && ty == "ClusterIP" {
                        causes.push(Cause::forbidden(&field, "may not be used when `type` is 'ClusterIP'"));
                    }
                    if let Some(m) = p.as_object_mut() {
                        m.remove("nodePort");
                    }
                    continue;
                }
                let port = p.get("port").and_then(Value::as_i64).unwrap_or_default();
                let np = match given {
                    Some(n) => {
                        let Ok(n) = u16::try_from(n) else {
                            causes.push(Cause::invalid(&field, &json!(n), "provided port is not in the valid range"));
                            continue;
                        };
                        let key = (n, proto.clone());
                        if n < self.ports.0 || n > self.ports.1 {
                            causes.push(Cause::invalid(&field, &json!(n), "provided port is not in the valid range"));
                            continue;
                        }
                        if seen.contains(&key) {
                            causes.push(Cause::duplicate(&field, &json!(n)));
                            continue;
                        }
                        if !old_set.contains(&key) {
                            if !self.used_ports.insert(key.clone()) {
                                causes.push(Cause::invalid(&field, &json!(n), "provided port is already allocated"));
                                continue;
                            }
                            done.ports.push(key.clone());
                        }
                        n
                    }
                    None => {
                        let reuse = old_ports
                            .iter()
                            .find(|(op, oproto, onp)| {
                                *op == port && *oproto == proto && !seen.contains(&(*onp, proto.clone()))
                            })
                            .map(|(_, _, n)| *n);
                        match reuse {
                            Some(n) => n,
                            None => match self.alloc_port(&proto) {
                                Some(n) => {
                                    done.ports.push((n, proto.clone()));
                                    n
                                }
                                None => {
                                    causes.push(Cause::invalid(&field, &Value::Null, "node port range is full"));
                                    continue;
                                }
                            },
                        }
                    }
                };
                seen.insert((np, proto));
                if let Some(m) = p.as_object_mut() {
                    m.insert("nodePort".into(), json!(np));
                }
            }
        }
        if causes.is_empty() { Ok(()) } else { Err(causes) }
    }

    /// After a committed update: free the old ports/IP the new object no longer uses.
    pub fn release_unused(&mut self, old: &Value, new: &Value) {
        let new_ports: HashSet<(u16, String)> = node_ports(new).into_iter().collect();
        for key in node_ports(old) {
            if !new_ports.contains(&key) {
                self.used_ports.remove(&key);
            }
        }
        let old_ip = old.pointer("/spec/clusterIP").and_then(Value::as_str);
        let new_ip = new.pointer("/spec/clusterIP").and_then(Value::as_str);
        if old_ip != new_ip
            && let Some(off) = old_ip.and_then(|ip| self.ip_offset(ip))
        {
            self.used_ips.remove(&off);
        }
    }
}

fn protocol(p: &Value) -> String {
    p.get("protocol").and_then(Value::as_str).unwrap_or("TCP").to_string()
}

fn node_ports(svc: &Value) -> Vec<(u16, String)> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter().filter_map(|p| Some((u16::try_from(p.get("nodePort")?.as_u64()?).ok()?, protocol(p)))).collect()
        })
        .unwrap_or_default()
}

/// The defaults the real API server fills into a Service.
fn default_service(svc: &mut Value) {
    let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let ty = spec.entry("type").or_insert(json!("ClusterIP")).as_str().unwrap_or("ClusterIP").to_string();
    if ty == "ExternalName" {
        return;
    }
    spec.entry("sessionAffinity").or_insert(json!("None"));
    spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
    spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
    spec.entry("internalTrafficPolicy").or_insert(json!("Cluster"));
    if ty == "NodePort" || ty == "LoadBalancer" {
        spec.entry("externalTrafficPolicy").or_insert(json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts").or_insert(json!(true));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert(json!("TCP"));
            if !p.contains_key("targetPort")
                && let Some(port) = p.get("port").cloned()
            {
                p.insert("targetPort".into(), port);
            }
        }
    }
}

/// On a type change, fields the new type cannot have are dropped when the update left them as
/// they were (as the genuine server does), instead of being rejected.
fn drop_type_dependent_fields(old: &Value, svc: &mut Value, ty: &str) {
    let unchanged = |svc: &Value, ptr: &str| svc.pointer(ptr) == old.pointer(ptr);
    let node_ports = ty == "NodePort" || ty == "LoadBalancer";
    let mut drop = vec![];
    if !node_ports {
        drop.push("/spec/externalTrafficPolicy");
    }
    if ty != "LoadBalancer" {
        for f in ["/spec/allocateLoadBalancerNodePorts", "/spec/loadBalancerClass", "/spec/healthCheckNodePort"] {
            if unchanged(svc, f) {
                drop.push(f);
            }
        }
    }
    let old_ports: Vec<Value> = old.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) else { return };
    for f in drop {
        spec.remove(f.trim_start_matches("/spec/"));
    }
    if !node_ports && let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            let kept = old_ports.iter().any(|o| {
                o.get("port") == p.get("port") && protocol(o) == protocol(p) && o.get("nodePort") == p.get("nodePort")
            });
            if kept && let Some(m) = p.as_object_mut() {
                m.remove("nodePort");
            }
        }
    }
}

/// Validation beyond allocation: ports present, names unique and present when several.
pub(crate) fn validate_service(svc: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let ty = svc.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP");
    let headless = svc.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None");
    let ports = svc.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    if ports.is_empty() && ty != "ExternalName" && !headless {
        causes.push(Cause::required("spec.ports", ""));
    }
    if !matches!(ty, "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName") {
        causes.push(Cause::invalid(
            "spec.type",
            &json!(ty),
            "supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
        ));
    }
    let mut names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let name = p.get("name").and_then(Value::as_str).unwrap_or("");
        if ports.len() > 1 && name.is_empty() {
            causes.push(Cause::required(&format!("spec.ports[{i}].name"), ""));
        }
        if !name.is_empty() && !names.insert(name.to_string()) {
            causes.push(Cause::duplicate(&format!("spec.ports[{i}].name"), &json!(name)));
        }
        match p.get("port").and_then(Value::as_i64) {
            Some(1..=65535) => {}
            other => {
                causes.push(Cause::invalid(
                    &format!("spec.ports[{i}].port"),
                    &json!(other),
                    "must be between 1 and 65535, inclusive",
                ));
                // The target port defaults to the port, and is checked too.
                if p.get("targetPort").is_none_or(|t| t == &json!(other)) {
                    causes.push(Cause::invalid(
                        &format!("spec.ports[{i}].targetPort"),
                        &json!(other),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_are_unique_and_reused_on_update() {
        let mut a = Allocator::new("10.96.0.0".parse().unwrap(), 12, (30000, 30002));
        let mut s1 = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        a.prepare(None, &mut s1).unwrap();
        let mut s2 = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        a.prepare(None, &mut s2).unwrap();
        assert_ne!(s1["spec"]["ports"][0]["nodePort"], s2["spec"]["ports"][0]["nodePort"]);
        assert_ne!(s1["spec"]["clusterIP"], s2["spec"]["clusterIP"]);
        let mut s1b = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        a.prepare(Some(&s1), &mut s1b).unwrap();
        assert_eq!(s1b["spec"]["ports"][0]["nodePort"], s1["spec"]["ports"][0]["nodePort"]);
        assert_eq!(s1b["spec"]["clusterIP"], s1["spec"]["clusterIP"]);
    }
}
