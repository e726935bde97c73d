//! Kubernetes client construction and the client-side rate limit.
//!
//! Every request the controllers send waits on one shared token bucket (`--kube-api-qps`
//! refilled per second, `--kube-api-burst` deep), like client-go's default rate limiter. The
//! limit is a tower layer inside the client, so it also covers watches and the reflectors.
//! Events use a separate client without it: they have their own budget (see
//! [`crate::events`]), and must never delay controller work.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

use crate::error::Error;
use crate::safe_yaml;

/// Upstream's `--kube-api-qps` default for the cloud-controller-manager.
pub const DEFAULT_QPS: f32 = 20.0;
/// Upstream's `--kube-api-burst` default for the cloud-controller-manager.
pub const DEFAULT_BURST: u32 = 30;

/// A token bucket shared by every clone of a rate-limited client.
///
/// Callers reserve a token and wait until it is due, so waiters are served in the order they
/// asked and a burst never exceeds `burst` requests.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    /// Tokens available at `at`; negative when reservations are queued.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive; `burst` is at least 1.
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps: f64::from(qps), burst, state: Mutex::new(BucketState { tokens: burst, at: Instant::now() }) }
    }

    /// Take one token; returns how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn reserve_at(&self, now: Instant) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(st.at).as_secs_f64();
        st.tokens = (st.tokens + elapsed * self.qps).min(self.burst);
        st.at = now;
        st.tokens -= 1.0;
        if st.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-st.tokens / self.qps) }
    }

    /// Wait for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// How long requests waited for the rate limiter, for `rest_client_rate_limiter_duration_seconds`.
pub type WaitObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// A tower layer that makes every request wait for a token of a shared [`TokenBucket`].
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<TokenBucket>>,
    observer: Option<WaitObserver>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").field("bucket", &self.bucket).finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A limit of `qps` requests per second with bursts of `burst`; `qps <= 0` disables it
    /// (upstream: `--kube-api-qps=0` means no limit).
    pub fn new(qps: f32, burst: u32) -> Self {
        let bucket = (qps > 0.0 && qps.is_finite()).then(|| Arc::new(TokenBucket::new(qps, burst)));
        Self { bucket, observer: None }
    }

    /// No limit.
    pub fn disabled() -> Self {
        Self { bucket: None, observer: None }
    }

    /// Report every wait (including zero waits) to `observer`.
    pub fn with_observer(mut self, observer: WaitObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Whether a limit is in force.
    pub fn is_enabled(&self) -> bool {
        self.bucket.is_some()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            observer: self.observer.clone(),
            sleep: None,
            permitted: false,
        }
    }
}

/// The service [`RateLimitLayer`] produces. The wait happens in `poll_ready`, so the kube
/// client's request buffer holds back every later request in order while one waits.
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<TokenBucket>>,
    observer: Option<WaitObserver>,
    sleep: Option<Pin<Box<Sleep>>>,
    permitted: bool,
}

impl<S, ReqBody> Service<Request<ReqBody>> for RateLimited<S>
where
    S: Service<Request<ReqBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket
            && !self.permitted
        {
            if self.sleep.is_none() {
                let wait = bucket.reserve();
                if let Some(observe) = &self.observer {
                    observe(wait);
                }
                if wait.is_zero() {
                    self.permitted = true;
                } else {
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
                self.permitted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

/// An existing [`Client`] as a tower service, so layers can be put in front of it.
#[derive(Clone)]
pub struct ClientService(pub Client);

impl Service<Request<Body>> for ClientService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(req).await.map_err(BoxError::from) })
    }
}

/// `client` behind `layer`: for callers (tests, the operator) that already hold a client.
pub fn with_rate_limit(client: &Client, layer: &RateLimitLayer) -> Client {
    if !layer.is_enabled() {
        return client.clone();
    }
    Client::new(layer.layer(ClientService(client.clone())), client.default_namespace().to_string())
}

/// Where to find the API server: upstream's `--kubeconfig` and `--master`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSource {
    /// `--kubeconfig`: a kubeconfig file path.
    pub kubeconfig: Option<String>,
    /// `--master`: overrides the server address of the kubeconfig.
    pub master: Option<String>,
}

/// How long reading and parsing one kubeconfig file may take (on a blocking thread).
pub const KUBECONFIG_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Load the client configuration: the kubeconfig file when given, else the in-cluster
/// configuration, else the default kubeconfig locations (`$KUBECONFIG`, `~/.kube/config`);
/// then `--master` overrides the server address.
///
/// Every kubeconfig goes through [`read_kubeconfig`] (bounded, off the async runtime), and
/// every error is a path or a fixed description: kubeconfigs hold credentials.
pub async fn load_config(source: &ClientSource) -> Result<Config, Error> {
    let mut config = match &source.kubeconfig {
        Some(path) if !path.is_empty() => {
            let path = std::path::PathBuf::from(path);
            let kubeconfig = read_kubeconfig_bounded(vec![path.clone()]).await?;
            config_from(kubeconfig, &path.display().to_string()).await?
        }
        _ => match Config::incluster() {
            Ok(c) => c,
            Err(_) => {
                let paths = default_kubeconfig_paths().ok_or_else(|| {
                    Error::ClientConfig(
                        "no in-cluster configuration, and no kubeconfig path could be determined (set KUBECONFIG or --kubeconfig)"
                            .into(),
                    )
                })?;
                let shown = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                let kubeconfig = read_kubeconfig_bounded(paths).await.map_err(|e| {
                    Error::ClientConfig(format!("no in-cluster configuration, and the default kubeconfig: {e}"))
                })?;
                config_from(kubeconfig, &shown).await?
            }
        },
    };
    if let Some(master) = source.master.as_deref().filter(|m| !m.is_empty()) {
        // Not quoted: a URL may carry credentials.
        config.cluster_url = master
            .parse()
            .map_err(|_| Error::ClientConfig("--master is not a URL such as https://10.0.0.1:6443".into()))?;
        check_server_url(&config.cluster_url).map_err(|m| Error::ClientConfig(format!("--master: {m}")))?;
    }
    Ok(config)
}

async fn config_from(kubeconfig: Kubeconfig, shown: &str) -> Result<Config, Error> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::ClientConfig(format!("kubeconfig {shown}: {}", describe_kubeconfig_error(&e))))?;
    check_server_url(&config.cluster_url).map_err(|m| Error::ClientConfig(format!("kubeconfig {shown}: {m}")))?;
    Ok(config)
}

/// `$KUBECONFIG`'s paths, else `~/.kube/config` (kube's and kubectl's order).
fn default_kubeconfig_paths() -> Option<Vec<std::path::PathBuf>> {
    if let Some(value) = std::env::var_os("KUBECONFIG") {
        let paths: Vec<_> = std::env::split_paths(&value).filter(|p| !p.as_os_str().is_empty()).collect();
        if !paths.is_empty() {
            return Some(paths);
        }
    }
    std::env::home_dir().map(|home| home.join(".kube").join("config")).map(|p| vec![p])
}

/// Whether the server is an `http(s)://host` URL; a fixed message otherwise.
fn check_server_url(url: &http::Uri) -> Result<(), &'static str> {
    match (url.scheme_str(), url.host()) {
        (Some("https" | "http"), Some(host)) if !host.is_empty() => Ok(()),
        _ => Err("the cluster's server is not an https:// or http:// URL with a host"),
    }
}

/// [`read_kubeconfig`] of every path, merged in order, on a blocking thread and within
/// [`KUBECONFIG_TIME_LIMIT`].
async fn read_kubeconfig_bounded(paths: Vec<std::path::PathBuf>) -> Result<Kubeconfig, Error> {
    let task = tokio::task::spawn_blocking(move || {
        paths.iter().try_fold(Kubeconfig::default(), |merged, path| {
            let next = read_kubeconfig(path)?;
            merged.merge(next).map_err(|e| {
                Error::ClientConfig(format!("kubeconfig {}: {}", path.display(), describe_kubeconfig_error(&e)))
            })
        })
    });
    match tokio::time::timeout(KUBECONFIG_TIME_LIMIT, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Error::ClientConfig("reading the kubeconfig failed (the reader panicked)".into())),
        Err(_) => Err(Error::ClientConfig(format!(
            "reading the kubeconfig took longer than the limit of {}s",
            KUBECONFIG_TIME_LIMIT.as_secs()
        ))),
    }
}

/// Read a kubeconfig file within [`safe_yaml::KUBECONFIG_LIMITS`] (checked on the bytes
/// before any parser sees them), resolving relative file references against the file's
/// directory as kubectl does. Errors name the file, a field path and the kind of problem,
/// never the file's content (it holds credentials). Blocking: see [`load_config`].
pub fn read_kubeconfig(path: &std::path::Path) -> Result<Kubeconfig, Error> {
    use std::io::Read;
    let limits = safe_yaml::KUBECONFIG_LIMITS;
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limits.max_bytes as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| Error::ClientConfig(format!("reading kubeconfig {shown}: {}", e.kind())))?;
    let text =
        safe_yaml::check(&bytes, &limits).map_err(|e| Error::ClientConfig(format!("kubeconfig {shown}: {e}")))?;
    // kube's parser, on the very bytes just checked; its message may quote the file, so a
    // failure is described by this crate's parser (paths and kinds), or by its kind alone.
    let mut kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| {
        let schema = kubeconfig_schema();
        match safe_yaml::documents_from_slice::<Kubeconfig>(&bytes, &limits, schema) {
            Err(parse) => Error::ClientConfig(format!("kubeconfig {shown}: {parse}")),
            Ok(_) => Error::ClientConfig(format!("kubeconfig {shown}: {}", describe_kubeconfig_error(&e))),
        }
    })?;
    if let Some(dir) = path.parent() {
        absolutize(&mut kubeconfig, dir);
    }
    Ok(kubeconfig)
}

fn kubeconfig_schema() -> &'static safe_yaml::Schema {
    static SCHEMA: std::sync::OnceLock<safe_yaml::Schema> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        safe_yaml::Schema::new()
            .with::<Kubeconfig>()
            .with::<kube::config::NamedCluster>()
            .with::<kube::config::Cluster>()
            .with::<kube::config::NamedContext>()
            .with::<kube::config::Context>()
            .with::<kube::config::NamedAuthInfo>()
            .with::<kube::config::AuthInfo>()
            .with::<kube::config::ExecConfig>()
            .with::<kube::config::AuthProviderConfig>()
            .with::<kube::config::NamedExtension>()
            .with::<kube::config::Preferences>()
    })
}

/// Make relative file references absolute against `dir` (what kube's own file reader does):
/// certificate authority, client certificate and key, token file, and an exec command that
/// contains a path separator.
fn absolutize(kubeconfig: &mut Kubeconfig, dir: &std::path::Path) {
    let fix = |file: &mut Option<String>| {
        if let Some(name) = file.as_deref()
            && std::path::Path::new(name).is_relative()
            && let Some(absolute) = dir.join(name).to_str()
        {
            *file = Some(absolute.to_owned());
        }
    };
    for cluster in kubeconfig.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        fix(&mut cluster.certificate_authority);
    }
    for auth in kubeconfig.auth_infos.iter_mut().filter_map(|a| a.auth_info.as_mut()) {
        fix(&mut auth.client_certificate);
        fix(&mut auth.client_key);
        fix(&mut auth.token_file);
        if let Some(exec) = auth.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
        {
            fix(&mut exec.command);
        }
    }
}

/// A kubeconfig error as fixed text: kube's messages may quote names, URLs or paths from the file.
fn describe_kubeconfig_error(error: &kube::config::KubeconfigError) -> &'static str {
    use kube::config::KubeconfigError as E;
    match error {
        E::CurrentContextNotSet => "no current-context is set",
        E::KindMismatch | E::ApiVersionMismatch => "its documents have different kinds or apiVersions",
        E::LoadContext(_) => "the current context is not defined in the file",
        E::LoadClusterOfContext(_) => "the current context's cluster is not defined in the file",
        E::FindPath => "no kubeconfig path could be determined",
        E::ReadConfig(..) => "the file could not be read",
        E::Parse(_) => "the file is not a valid kubeconfig",
        E::MissingClusterUrl => "the cluster has no server URL",
        E::ParseClusterUrl(_) => "the cluster's server is not a valid URL",
        E::ParseProxyUrl(_) => "the cluster's proxy-url is not a valid URL",
        E::LoadCertificateAuthority(_) => "the certificate authority could not be loaded",
        E::LoadClientCertificate(_) => "the client certificate could not be loaded",
        E::LoadClientKey(_) => "the client key could not be loaded",
        E::ParseCertificates(_) => "a PEM certificate could not be parsed",
    }
}

/// A client-building error as fixed text.
fn describe_client_error(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Auth(_) => "the kubeconfig's credentials could not be used",
        kube::Error::RustlsTls(_) => "the kubeconfig's TLS settings (certificates or keys) could not be used",
        kube::Error::InferKubeconfig(e) => describe_kubeconfig_error(e),
        kube::Error::InferConfig(_) => "the configuration could not be loaded",
        _ => "the client could not be built from the configuration",
    }
}

/// Build a client from `config` with `layer` in its stack.
pub fn build_client(config: Config, layer: &RateLimitLayer) -> Result<Client, Error> {
    // kube's message may quote a certificate or URL from the kubeconfig: kinds only.
    let builder = ClientBuilder::try_from(config).map_err(|e| Error::ClientConfig(describe_client_error(&e).into()))?;
    Ok(if layer.is_enabled() { builder.with_layer(layer).build() } else { builder.build() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    const TOKEN: &str = "SECRET-TOKEN-12345";

    /// Kubeconfigs with the token in every field, each broken in some way: the YAML, a type,
    /// a reference, a URL, a certificate, a file.
    fn broken_kubeconfigs() -> Vec<String> {
        let t = TOKEN;
        let users = format!("users: [{{name: u, user: {{token: {t}, username: {t}, password: {t}}}}}]\n");
        let contexts = format!("contexts: [{{name: c, context: {{cluster: k, user: u, namespace: {t}}}}}]\n");
        let tail = format!("current-context: c\n{contexts}{users}");
        let cluster = |fields: &str| format!("clusters:\n  - name: k\n    cluster: {{{fields}}}\n{tail}");
        let user = |fields: &str| {
            format!(
                "clusters: [{{name: k, cluster: {{server: \"https://x\"}}}}]\ncurrent-context: c\n{contexts}users: [{{name: u, user: {{{fields}}}}}]\n"
            )
        };
        let mut docs = vec![
            // Not YAML, or not a kubeconfig.
            format!("apiVersion: v1\nkind: Config\n2 | {t}\n"),
            format!("{t}\n  {t}: [\n"),
            format!("clusters: [{{name: \"{t}\n"),
            format!("clusters: {t}\n"),
            format!("{t}: a: b\n"),
            format!("users:\n\t- name: {t}\n"),
            format!("apiVersion: v1\n---\napiVersion: {t}\nkind: {t}\n"),
            format!("kind: Config\n---\nkind: {t}\n"),
            format!("users: {}{t}\n", "[".repeat(200)),
            format!("clusters: *{t}\n"),
            format!("preferences: {{colors: {t}}}\n"),
            // Wrong types in every part.
            cluster(&format!("server: [{t}]")),
            cluster(&format!("server: \"https://x\", insecure-skip-tls-verify: {t}")),
            cluster(&format!("server: \"https://x\", disable-compression: {t}")),
            cluster(&format!("server: \"https://x\", extensions: {t}")),
            user(&format!("exec: {{command: [{t}]}}")),
            user(&format!("exec: {{command: {t}, args: {t}}}")),
            user(&format!("exec: {{command: {t}, env: {t}}}")),
            user(&format!("as-groups: [[{t}]]")),
            user(&format!("as: [{t}]")),
            user(&format!("auth-provider: {{name: {t}, config: [{t}]}}")),
            user(&format!("client-key-data: {{{t}: 1}}")),
            // References that do not resolve.
            format!("current-context: {t}\n{contexts}{users}"),
            format!("clusters: []\ncurrent-context: c\ncontexts: [{{name: c, context: {{cluster: {t}, user: u}}}}]\n"),
            format!("clusters: [{{name: {t}, cluster: {{server: \"https://x\"}}}}]\n{tail}"),
            // Server URLs.
            cluster(&format!("server: \"{t}\"")),
            cluster(&format!("server: \"https://{t} x\"")),
            cluster(&format!("server: \"ftp://{t}\"")),
            cluster(&format!("server: \"ftp://x\", tls-server-name: {t}")),
            cluster(&format!("server: \"https://x\", proxy-url: \"{t} x\"")),
            // Certificates and files.
            cluster(&format!("server: \"https://x\", certificate-authority-data: {t}")),
            cluster(&format!("server: \"https://x\", certificate-authority: /{t}/ca.crt")),
            cluster(&format!("server: \"https://x\", certificate-authority: {t}.crt")),
            user(&format!("client-certificate-data: {t}, client-key-data: {t}")),
            user(&format!("client-certificate: /{t}/c.crt, client-key: /{t}/c.key")),
            user(&format!("tokenFile: /{t}/token")),
        ];
        docs.push("clusters: [{name: k, cluster: {server: \"https://x\"}}]\n".to_string());
        docs
    }

    #[tokio::test]
    async fn kubeconfig_errors_never_quote_the_file() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut accepted = Vec::new();
        for (i, doc) in broken_kubeconfigs().into_iter().enumerate() {
            let path = dir.join(format!("k{i}.yaml"));
            std::fs::write(&path, &doc).unwrap();
            let source = ClientSource { kubeconfig: Some(path.display().to_string()), master: None };
            // Loading, then building the client (certificates are read there).
            let (result, loaded) = match load_config(&source).await {
                Ok(config) => (build_client(config, &RateLimitLayer::disabled()).map(|_| ()), true),
                Err(e) => (Err(e), false),
            };
            let Err(error) = result else {
                accepted.push(doc);
                continue;
            };
            for message in [error.to_string(), format!("{error:?}")] {
                assert!(!message.contains("SECRET"), "kubeconfig {i}:\n{doc}\n=> {message}");
            }
            // Loading names the file; building a client knows only the loaded configuration.
            assert!(loaded || error.to_string().contains(&format!("k{i}.yaml")), "the file is named: {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(accepted.is_empty(), "accepted:\n{}", accepted.join("\n"));
    }

    #[tokio::test]
    async fn master_flag_errors_never_quote_the_url() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-master-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ok.yaml");
        std::fs::write(
            &path,
            "clusters: [{name: k, cluster: {server: \"https://x\"}}]\ncontexts: [{name: c, context: {cluster: k}}]\ncurrent-context: c\n",
        )
        .unwrap();
        let kubeconfig = Some(path.display().to_string());
        for master in [format!("https://{TOKEN} x"), TOKEN.to_string(), format!("ftp://{TOKEN}")] {
            let source = ClientSource { kubeconfig: kubeconfig.clone(), master: Some(master.clone()) };
            let error = load_config(&source).await.expect_err(&master);
            assert!(!format!("{error} {error:?}").contains("SECRET"), "{error}");
        }
        let source = ClientSource { kubeconfig, master: Some("https://10.0.0.1:6443".into()) };
        assert_eq!(load_config(&source).await.unwrap().cluster_url, "https://10.0.0.1:6443/");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn relative_file_references_resolve_against_the_kubeconfig_directory() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-rel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "clusters: [{name: k, cluster: {server: \"https://x\", certificate-authority: ca.crt}}]\nusers: [{name: u, user: {client-key: /abs/c.key, tokenFile: t/token, exec: {command: bin/get-token, apiVersion: client.authentication.k8s.io/v1}}}, {name: v, user: {exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}}]\n",
        )
        .unwrap();
        let config = read_kubeconfig(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let at = |name: &str| dir.join(name).display().to_string();
        assert_eq!(config.clusters[0].cluster.as_ref().unwrap().certificate_authority, Some(at("ca.crt")));
        let user = config.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_key.as_deref(), Some("/abs/c.key"));
        assert_eq!(user.token_file, Some(at("t/token")));
        assert_eq!(user.exec.as_ref().unwrap().command, Some(at("bin/get-token")));
        let bare = config.auth_infos[1].auth_info.as_ref().unwrap();
        assert_eq!(bare.exec.as_ref().unwrap().command.as_deref(), Some("aws"), "a bare command is looked up in PATH");
    }

    #[test]
    fn hostile_kubeconfigs_are_refused_with_the_limit_they_break() {
        let path = std::env::temp_dir().join(format!("ccm-kubeconfig-hostile-{}.yaml", std::process::id()));
        for (name, doc, problem) in safe_yaml::hostile::all() {
            std::fs::write(&path, &doc).unwrap();
            let message = read_kubeconfig(&path).unwrap_err().to_string();
            let want = match problem {
                // Kubeconfigs may be larger than cloud-configs.
                safe_yaml::Problem::TooLarge { .. } => {
                    safe_yaml::Problem::TooLarge { limit: safe_yaml::KUBECONFIG_LIMITS.max_bytes }
                }
                other => other,
            };
            assert!(message.contains(&want.to_string()), "{name}: {message}");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_oversized_kubeconfig_is_refused_before_parsing() {
        let path = std::env::temp_dir().join(format!("ccm-kubeconfig-big-{}.yaml", std::process::id()));
        let mut doc = format!("users: [{{name: u, user: {{token: {TOKEN}}}}}]\n");
        doc.push_str(&"# padding\n".repeat(safe_yaml::KUBECONFIG_LIMITS.max_bytes / 10 + 1));
        std::fs::write(&path, &doc).unwrap();
        let message = read_kubeconfig(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(message.contains(&format!("limit of {} bytes", safe_yaml::KUBECONFIG_LIMITS.max_bytes)), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_a_burst_then_paces_at_qps() {
        let bucket = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..5).map(|_| bucket.reserve_at(t0)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3], "the burst is immediate");
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200), "queued reservations are served in order");
        // After a quiet second the bucket is full again, but never more than the burst.
        let t1 = t0 + Duration::from_secs(10);
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve_at(t1)).collect();
        assert_eq!(waits, [Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::from_millis(100)]);
    }

    #[derive(Clone)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<()>> for Counting {
        type Response = ();
        type Error = BoxError;
        type Future = std::future::Ready<Result<(), BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_holds_requests_beyond_the_burst() {
        let count = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::new(5.0, 2);
        let mut svc = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        for _ in 0..4 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 4);
        // Two immediate, then one every 200ms.
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn clones_of_a_layer_share_one_budget() {
        let count = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::new(1.0, 1);
        let mut a = layer.layer(Counting(count.clone()));
        let mut b = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        a.ready().await.unwrap().call(Request::new(())).await.unwrap();
        b.ready().await.unwrap().call(Request::new(())).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_disables_the_limit() {
        let layer = RateLimitLayer::new(0.0, 0);
        assert!(!layer.is_enabled());
        let count = Arc::new(AtomicUsize::new(0));
        let mut svc = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        for _ in 0..100 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(count.load(Ordering::SeqCst), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_reported_to_the_observer() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let layer = RateLimitLayer::new(2.0, 1).with_observer(Arc::new(move |d| record.lock().unwrap().push(d)));
        let mut svc = layer.layer(Counting(Arc::new(AtomicUsize::new(0))));
        for _ in 0..2 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(*seen.lock().unwrap(), [Duration::ZERO, Duration::from_millis(500)]);
    }
}
