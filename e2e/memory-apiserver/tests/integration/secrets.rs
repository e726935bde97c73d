//! Secret `stringData`: folded into `data` (base64) on every write and never stored, as the real
//! API server does when it decodes a Secret.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::{api_err, raw, server};

fn data(s: &Secret) -> BTreeMap<String, String> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8(v.0.clone()).expect("utf-8 test data")))
        .collect()
}

fn expected(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[tokio::test]
async fn string_data_is_folded_into_data_on_create_and_never_stored() {
    let s = server().await;
    let secrets: Api<Secret> = Api::default_namespaced(s.client());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "data": {"kept": "a2VwdA==", "both": "b2xk"},
        "stringData": {"both": "new", "plain": "hello: world\n"},
    }))
    .unwrap();
    let created = secrets.create(&PostParams::default(), &secret).await.unwrap();
    let want = expected(&[("kept", "kept"), ("both", "new"), ("plain", "hello: world\n")]);
    assert_eq!(data(&created), want, "stringData wins over data for the same key");
    assert!(created.string_data.is_none(), "the response carries no stringData");

    let stored = secrets.get("creds").await.unwrap();
    assert_eq!(data(&stored), want);
    assert!(stored.string_data.is_none(), "stringData is not stored");
    // On the wire, data is base64 like any Secret's.
    let text = raw(&s.client(), "GET", "/api/v1/namespaces/default/secrets/creds", "application/json", &json!({}))
        .await
        .unwrap();
    let wire: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(wire["data"]["plain"], json!("aGVsbG86IHdvcmxkCg=="));
    assert!(wire.get("stringData").is_none());
}

#[tokio::test]
async fn string_data_is_folded_on_update_merge_patch_and_apply() {
    let s = server().await;
    let secrets: Api<Secret> = Api::default_namespaced(s.client());
    let mut secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some("cfg".into()), ..Default::default() },
        data: Some([("a".to_string(), ByteString(b"1".to_vec()))].into()),
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();

    // PUT
    secret = secrets.get("cfg").await.unwrap();
    secret.string_data = Some([("b".to_string(), "2".to_string())].into());
    let updated = secrets.replace("cfg", &PostParams::default(), &secret).await.unwrap();
    assert_eq!(data(&updated), expected(&[("a", "1"), ("b", "2")]));
    assert!(updated.string_data.is_none());

    // Merge patch
    let patched = secrets
        .patch("cfg", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"a": "one"}})))
        .await
        .unwrap();
    assert_eq!(data(&patched), expected(&[("a", "one"), ("b", "2")]));

    // Server-side apply, creating and updating
    let apply = |value: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "applied"},
            "stringData": {"cloud.conf": value}})
    };
    let params = PatchParams::apply("tester").force();
    let first = secrets.patch("applied", &params, &Patch::Apply(apply("v1"))).await.unwrap();
    assert_eq!(data(&first), expected(&[("cloud.conf", "v1")]));
    let second = secrets.patch("applied", &params, &Patch::Apply(apply("v2"))).await.unwrap();
    assert_eq!(data(&second), expected(&[("cloud.conf", "v2")]));
    assert!(secrets.get("applied").await.unwrap().string_data.is_none());
}

#[tokio::test]
async fn non_string_string_data_is_a_bad_request() {
    let s = server().await;
    let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"}, "stringData": {"n": 5}});
    let err = api_err(raw(&s.client(), "POST", "/api/v1/namespaces/default/secrets", "application/json", &body).await);
    assert_eq!(err.code, 400);
}
