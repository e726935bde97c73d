//! What the modules of this test binary share beyond the test kit (`testkit`): a controller's
//! test world ([`Engine`], [`EngineFor`]), running a test alone in a process, and the fake provider's resource.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use ccm_framework::controller::{Context, Controller};
use ccm_framework::health::HealthRegistry;
use ccm_framework::options::ControllerOptions;
use ccm_provider_fake::FakeProvider;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use testkit::TestCluster;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A controller test's world: an API server (either backend), a fake cloud, and an engine
/// context on them whose caches have synced; controllers started with [`Engine::run`] share it.
/// Dropping it stops them.
pub struct Engine {
    /// The API server.
    pub cluster: TestCluster,
    /// The cloud the controllers talk to.
    pub fake: Arc<FakeProvider>,
    /// The Nodes, as an admin.
    pub nodes: Api<Node>,
    /// What the controllers get: caches, metrics, events, the shutdown token.
    pub ctx: Context,
}

impl Engine {
    /// The context for `fake` with `options` on `cluster`, caches synced; no controller runs yet.
    pub async fn start(cluster: TestCluster, options: ControllerOptions, fake: FakeProvider) -> Engine {
        testkit::init_tracing();
        let client = cluster.client();
        let fake = Arc::new(fake);
        let ctx =
            ccm_framework::engine::testing::context(client.clone(), fake.clone(), options, CancellationToken::new())
                .await;
        Engine { nodes: Api::all(client), cluster, fake, ctx }
    }

    /// Runs `controller` on the shared context until the engine is dropped.
    pub fn run(&self, controller: Box<dyn Controller>) -> JoinHandle<Result<(), ccm_framework::Error>> {
        let health = HealthRegistry::new().handle(controller.name());
        tokio::spawn(controller.run(self.ctx.clone(), health))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.ctx.shutdown.cancel();
    }
}

/// An [`Engine`] as the tests of controller `C` use it: each module adds its own methods
/// (`impl EngineFor<NodeController> { .. }`) and reaches the engine's fields as its own.
pub struct EngineFor<C>(Engine, PhantomData<C>);

impl<C> EngineFor<C> {
    /// The engine, for `C`'s tests.
    pub fn new(engine: Engine) -> Self {
        EngineFor(engine, PhantomData)
    }
}

impl<C> Deref for EngineFor<C> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.0
    }
}

/// For a test that measures its whole process (CPU time), which the other tests of this binary
/// share: runs `test` (its full name) alone in a child process of this binary. Returns true in
/// that child, where the test does its work; in the parent, waits for the child, fails with its
/// output if it failed, and returns false.
pub fn alone_in_a_process(test: &str) -> bool {
    const CHILD: &str = "CCM_TEST_ALONE";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test}, alone in a process:\n{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{test} ran in the child:\n{stdout}");
    false
}

/// Installs the CRD and creates `kube-system/fake`, a resource of the fake provider for the
/// manager to report on (`--ccm-resource`).
pub async fn install_fake_ccm(cluster: &TestCluster) -> Api<crds::CloudControllerManager> {
    cluster.install_crd(&crds::crd()).await.unwrap();
    let api: Api<crds::CloudControllerManager> = Api::namespaced(cluster.client(), "kube-system");
    let ccm = testkit::cr("kube-system", "fake", serde_json::json!({"provider": "fake"}));
    api.create(&kube::api::PostParams::default(), &ccm).await.unwrap();
    api
}
