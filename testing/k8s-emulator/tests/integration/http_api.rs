//! The emulator's API rules, exercised over real HTTP.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_emulator::{DroppedReply, Emulator, EmulatorConfig, Failure, Verb};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

struct Api {
    emulator: Emulator,
    client: Client,
}

impl Api {
    async fn start() -> Self {
        let emulator = Emulator::start(EmulatorConfig::default().namespace("other"))
            .await
            .expect("emulator starts");
        Self {
            emulator,
            client: Client::new(),
        }
    }

    fn leases(&self, ns: &str) -> String {
        format!(
            "{}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
            self.emulator.url()
        )
    }

    fn lease(&self, ns: &str, name: &str) -> String {
        format!("{}/{name}", self.leases(ns))
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<Value>,
        content_type: &str,
    ) -> (StatusCode, Value) {
        self.send_as(self.emulator.admin_token(), method, url, body, content_type)
            .await
    }

    async fn send_as(
        &self,
        token: &str,
        method: Method,
        url: &str,
        body: Option<Value>,
        content_type: &str,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, url).bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("content-type", content_type)
                .body(body.to_string());
        }
        let response = request.send().await.expect("request is answered");
        let status = response.status();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    async fn create(&self, ns: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            Method::POST,
            &self.leases(ns),
            Some(body),
            "application/json",
        )
        .await
    }

    async fn put(&self, ns: &str, name: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            Method::PUT,
            &self.lease(ns, name),
            Some(body),
            "application/json",
        )
        .await
    }

    async fn get(&self, ns: &str, name: &str) -> (StatusCode, Value) {
        self.send(Method::GET, &self.lease(ns, name), None, "")
            .await
    }
}

fn lease(name: &str, holder: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 10,
            "renewTime": "2025-01-02T03:04:05.123456Z",
        },
    })
}

fn rv(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

fn assert_status(body: &Value, code: u16, reason: &str, message: &str) {
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["apiVersion"], "v1", "{body}");
    assert_eq!(body["status"], "Failure", "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    assert_eq!(body["message"], message, "{body}");
}

#[tokio::test]
async fn create_sets_server_metadata_and_a_second_create_is_already_exists() {
    let api = Api::start().await;
    let (status, created) = api.create("default", lease("a", "one")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["metadata"]["namespace"], "default");
    assert!(
        created["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(created["metadata"]["creationTimestamp"].is_string());
    assert_eq!(rv(&created), api.emulator.revision().to_string());
    assert_eq!(created["spec"]["renewTime"], "2025-01-02T03:04:05.123456Z");
    // Leases get no server-set generation.
    assert!(created["metadata"].get("generation").is_none());

    let (status, body) = api.create("default", lease("a", "two")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_status(
        &body,
        409,
        "AlreadyExists",
        "leases.coordination.k8s.io \"a\" already exists",
    );
    assert_eq!(
        body["details"],
        json!({"name": "a", "group": "coordination.k8s.io", "kind": "leases"})
    );
    let (_, still) = api.get("default", "a").await;
    assert_eq!(still["spec"]["holderIdentity"], "one");
}

#[tokio::test]
async fn update_is_compare_and_set_on_resource_version() {
    let api = Api::start().await;
    let (_, created) = api.create("default", lease("a", "one")).await;
    let first = rv(&created);

    let mut next = created.clone();
    next["spec"]["holderIdentity"] = json!("two");
    let (status, updated) = api.put("default", "a", next.clone()).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert!(rv(&updated).parse::<u64>().unwrap() > first.parse::<u64>().unwrap());
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);

    // The same body again carries the old resourceVersion: stale.
    next["spec"]["holderIdentity"] = json!("three");
    let (status, body) = api.put("default", "a", next.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_status(
        &body,
        409,
        "Conflict",
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"a\": the object has been modified; please apply your changes to the latest version and try again",
    );
    let (_, current) = api.get("default", "a").await;
    assert_eq!(current["spec"]["holderIdentity"], "two");

    // Leases refuse unconditional updates.
    let mut blind = current.clone();
    blind["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let (status, body) = api.put("default", "a", blind).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_status(
        &body,
        422,
        "Invalid",
        "leases.coordination.k8s.io \"a\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
    );

    // An update that changes nothing is not a write.
    let before = api.emulator.revision();
    let (status, same) = api.put("default", "a", current.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rv(&same), rv(&current));
    assert_eq!(api.emulator.revision(), before);

    // A uid in the body is a precondition.
    let mut other_uid = current.clone();
    other_uid["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000000");
    other_uid["spec"]["holderIdentity"] = json!("x");
    let (status, body) = api.put("default", "a", other_uid).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: UID in precondition"),
        "{body}"
    );
}

#[tokio::test]
async fn racing_updates_from_one_version_have_exactly_one_winner() {
    let api = Arc::new(Api::start().await);
    let (_, created) = api.create("default", lease("race", "nobody")).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let api = api.clone();
        let mut body = created.clone();
        body["spec"]["holderIdentity"] = json!(format!("holder-{i}"));
        tasks.push(tokio::spawn(async move {
            api.put("default", "race", body).await.0
        }));
    }
    let mut won = 0;
    let mut conflicts = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::OK => won += 1,
            StatusCode::CONFLICT => conflicts += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((won, conflicts), (1, 15));
}

#[tokio::test]
async fn put_to_an_absent_lease_creates_it_and_names_must_match() {
    let api = Api::start().await;
    let (status, created) = api.put("default", "fresh", lease("fresh", "x")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, body) = api.put("default", "fresh", lease("other", "x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_status(
        &body,
        400,
        "BadRequest",
        "the name of the object (other) does not match the name on the URL (fresh)",
    );
}

#[tokio::test]
async fn put_of_a_deleted_lease_is_a_conflict_and_never_recreates_it() {
    let api = Api::start().await;
    let (_, created) = api.create("default", lease("a", "one")).await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let url = api.lease("default", "a");
    let (status, _) = api.send(Method::DELETE, &url, None, "").await;
    assert_eq!(status, StatusCode::OK);
    let revision = api.emulator.revision();

    // A client writing back the object it read (uid and resourceVersion
    // of the deleted one) finds the precondition failed.
    let mut stale = created.clone();
    stale["spec"]["holderIdentity"] = json!("one-renewed");
    let (status, body) = api.put("default", "a", stale.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_status(
        &body,
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on leases.coordination.k8s.io \"a\": Precondition failed: UID in precondition: {uid}, UID in object meta: "
        ),
    );
    assert_eq!(api.get("default", "a").await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.emulator.revision(), revision, "nothing was written");

    // Recreated under the same name: the old uid is still refused, with
    // or without a resourceVersion.
    let (_, again) = api.create("default", lease("a", "two")).await;
    let new_uid = again["metadata"]["uid"].as_str().unwrap().to_string();
    assert_ne!(new_uid, uid);
    let (status, body) = api.put("default", "a", stale).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "Conflict");
    let (_, current) = api.get("default", "a").await;
    assert_eq!(current["spec"]["holderIdentity"], "two");

    // Without a uid a PUT to an absent name still creates (leases allow
    // create-on-update).
    let (status, body) = api.put("default", "b", lease("b", "x")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn restore_rewinds_leases_and_versions_and_wipe_starts_over() {
    let api = Api::start().await;
    let (_, a) = api.create("default", lease("a", "one")).await;
    let (_, doomed) = api.create("other", lease("doomed", "x")).await;
    let snapshot = api.emulator.snapshot();
    assert_eq!(snapshot.revision(), api.emulator.revision());
    assert_eq!(snapshot.lease_count(), 2);

    let mut next = a.clone();
    next["spec"]["holderIdentity"] = json!("two");
    let (_, updated) = api.put("default", "a", next).await;
    let (_, b) = api.create("default", lease("b", "three")).await;
    let (status, _) = api
        .send(Method::DELETE, &api.lease("other", "doomed"), None, "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(api.emulator.revision() > snapshot.revision());

    api.emulator.restore(&snapshot);
    assert_eq!(api.emulator.revision(), snapshot.revision());
    // Each object as it was, with its old version and uid; later ones gone.
    let (_, back) = api.get("default", "a").await;
    assert_eq!(back, a);
    let (status, back) = api.get("other", "doomed").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(back, doomed);
    assert_eq!(api.get("default", "b").await.0, StatusCode::NOT_FOUND);
    // The old version of "a" is current again: a write under it wins, and
    // gets the very version the overwritten update had.
    let mut again = a.clone();
    again["spec"]["holderIdentity"] = json!("four");
    let (status, rewritten) = api.put("default", "a", again).await;
    assert_eq!(status, StatusCode::OK, "{rewritten}");
    assert_eq!(
        rv(&rewritten),
        rv(&updated),
        "versions are handed out again"
    );
    let (_, c) = api.create("default", lease("c", "five")).await;
    assert_eq!(rv(&c), rv(&b));

    api.emulator.wipe();
    assert_eq!(api.emulator.revision(), 0);
    assert_eq!(api.get("default", "a").await.0, StatusCode::NOT_FOUND);
    let (status, list) = api
        .send(Method::GET, &api.leases("default"), None, "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"], json!([]));
    assert_eq!(list["metadata"]["resourceVersion"], "0");
    let (status, fresh) = api.create("default", lease("a", "six")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(rv(&fresh), "1");
    assert_ne!(fresh["metadata"]["uid"], a["metadata"]["uid"]);

    // A snapshot can be restored more than once.
    api.emulator.restore(&snapshot);
    assert_eq!(api.get("default", "a").await.1, a);
}

#[tokio::test]
async fn delete_honours_preconditions() {
    let api = Api::start().await;
    let (_, created) = api.create("default", lease("a", "one")).await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let url = api.lease("default", "a");
    let delete = |body: Value| api.send(Method::DELETE, &url, Some(body), "application/json");

    let (status, body) = delete(json!({"preconditions": {"uid": "not-it"}})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_status(
        &body,
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on leases.coordination.k8s.io \"a\": Precondition failed: UID in precondition: not-it, UID in object meta: {uid}"
        ),
    );
    let (status, body) = delete(json!({"preconditions": {"resourceVersion": "1"}})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: ResourceVersion in precondition: 1"),
        "{body}"
    );
    assert_eq!(api.get("default", "a").await.0, StatusCode::OK);

    let (status, body) = delete(
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid, "resourceVersion": rv(&created)}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "Success");
    assert_eq!(body["details"]["uid"], uid.as_str());
    let (status, body) = api.get("default", "a").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_status(
        &body,
        404,
        "NotFound",
        "leases.coordination.k8s.io \"a\" not found",
    );
}

#[tokio::test]
async fn validation_errors_are_invalid_with_causes() {
    let api = Api::start().await;
    let (status, body) = api.create("default", lease("Not_A_Name", "x")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["kind"], "Lease");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
    assert_eq!(body["details"]["causes"][0]["reason"], "FieldValueInvalid");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Lease.coordination.k8s.io \"Not_A_Name\" is invalid: metadata.name: Invalid value: \"Not_A_Name\": a lowercase RFC 1123 subdomain"),
        "{body}"
    );

    let mut bad = lease("b", "x");
    bad["spec"]["leaseDurationSeconds"] = json!(0);
    bad["spec"]["leaseTransitions"] = json!(-1);
    let (status, body) = api.create("default", bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["message"],
        "Lease.coordination.k8s.io \"b\" is invalid: [spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0, spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0]"
    );
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["spec.leaseDurationSeconds", "spec.leaseTransitions"]
    );

    let mut seconds_only = lease("c", "x");
    seconds_only["spec"]["renewTime"] = json!("2025-01-02T03:04:05Z");
    let (status, body) = api.create("default", seconds_only).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["reason"], "BadRequest");

    let (status, body) = api
        .send(
            Method::POST,
            &api.leases("default"),
            Some(Value::String("{not json".into())),
            "application/json",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let (status, body) = api
        .send(
            Method::POST,
            &api.leases("default"),
            Some(lease("d", "x")),
            "text/plain",
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["reason"], "UnsupportedMediaType");
    // Nothing invalid was stored.
    assert_eq!(api.emulator.revision(), 2);
}

#[tokio::test]
async fn unknown_namespace_is_not_found_and_unknown_paths_and_methods_are_refused() {
    let api = Api::start().await;
    let (status, body) = api.create("nowhere", lease("a", "x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_status(&body, 404, "NotFound", "namespaces \"nowhere\" not found");
    assert_eq!(
        api.create("other", lease("a", "x")).await.0,
        StatusCode::CREATED
    );

    let (status, body) = api
        .send(
            Method::POST,
            &api.lease("other", "a"),
            Some(lease("a", "x")),
            "application/json",
        )
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["reason"], "MethodNotAllowed");
    let url = format!("{}/apis/apps/v1/deployments", api.emulator.url());
    assert_eq!(
        api.send(Method::GET, &url, None, "").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn rbac_allow_list_and_authentication() {
    let api = Api::start().await;
    api.create("default", lease("a", "x")).await;
    let reader = api.emulator.rbac().add_user("reader");
    api.emulator
        .rbac()
        .allow("reader", &[Verb::Get, Verb::List], "leases");
    let (status, got) = api
        .send_as(&reader, Method::GET, &api.lease("default", "a"), None, "")
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = api
        .send_as(
            &reader,
            Method::PUT,
            &api.lease("default", "a"),
            Some(got),
            "application/json",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_status(
        &body,
        403,
        "Forbidden",
        "leases.coordination.k8s.io \"a\" is forbidden: User \"reader\" cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\"",
    );
    let (status, body) = api
        .send_as(
            &reader,
            Method::POST,
            &api.leases("default"),
            Some(lease("b", "x")),
            "application/json",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body["message"],
        "leases.coordination.k8s.io is forbidden: User \"reader\" cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\""
    );
    api.emulator.rbac().revoke("reader", &[Verb::Get], "leases");
    let (status, _) = api
        .send_as(&reader, Method::GET, &api.lease("default", "a"), None, "")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, body) = api
        .send_as(
            "nobody-has-this",
            Method::GET,
            &api.lease("default", "a"),
            None,
            "",
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["reason"], "Unauthorized");
    let anonymous = api
        .client
        .get(api.lease("default", "a"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::FORBIDDEN);
    let body: Value = anonymous.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("User \"system:anonymous\" cannot get")
    );
}

#[tokio::test]
async fn patches_merge_strategic_json_and_apply() {
    let api = Api::start().await;
    api.create("default", lease("a", "one")).await;
    let url = api.lease("default", "a");

    let (status, patched) = api
        .send(
            Method::PATCH,
            &url,
            Some(json!({"metadata": {"labels": {"app": "web"}}, "spec": {"holderIdentity": "two", "renewTime": null}})),
            "application/merge-patch+json",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["holderIdentity"], "two");
    assert!(patched["spec"].get("renewTime").is_none());
    assert_eq!(patched["metadata"]["labels"]["app"], "web");

    let (status, patched) = api
        .send(
            Method::PATCH,
            &url,
            Some(json!({"metadata": {"finalizers": ["x/y"]}, "spec": {"leaseTransitions": 3}})),
            "application/strategic-merge-patch+json; charset=utf-8",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["leaseTransitions"], 3);

    // A stale resourceVersion in a patch is a precondition that fails.
    let (status, body) = api
        .send(
            Method::PATCH,
            &url,
            Some(json!({"metadata": {"resourceVersion": "2"}, "spec": {"holderIdentity": "late"}})),
            "application/merge-patch+json",
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "Conflict");

    let (status, body) = api
        .send(
            Method::PATCH,
            &url,
            Some(
                json!([{"op": "test", "path": "/spec/holderIdentity", "value": "nobody"},
                        {"op": "replace", "path": "/spec/holderIdentity", "value": "three"}]),
            ),
            "application/json-patch+json",
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, patched) = api
        .send(
            Method::PATCH,
            &url,
            Some(
                json!([{"op": "test", "path": "/spec/holderIdentity", "value": "two"},
                        {"op": "replace", "path": "/spec/holderIdentity", "value": "three"}]),
            ),
            "application/json-patch+json",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["holderIdentity"], "three");

    let (status, body) = api
        .send(Method::PATCH, &url, Some(json!({})), "application/json")
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("application/merge-patch+json")
    );

    let (status, body) = api
        .send(
            Method::PATCH,
            &api.lease("default", "missing"),
            Some(json!({"spec": {}})),
            "application/merge-patch+json",
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    let applied = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": "b"}, "spec": {"holderIdentity": "ssa"}});
    let apply_url = format!("{}?fieldManager=test", api.lease("default", "b"));
    let (status, body) = api
        .send(
            Method::PATCH,
            &apply_url,
            Some(applied.clone()),
            "application/apply-patch+yaml",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = api
        .send(
            Method::PATCH,
            &api.lease("default", "b"),
            Some(applied),
            "application/apply-patch+yaml",
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn list_filters_by_selectors_and_pages() {
    let api = Api::start().await;
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut body = lease(name, "x");
        body["metadata"]["labels"] = json!({"app": app});
        api.create("default", body).await;
    }
    let mut body = lease("d", "x");
    body["metadata"]["labels"] = json!({"app": "web"});
    api.create("other", body).await;

    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let url = format!("{}?labelSelector=app%3Dweb", api.leases("default"));
    let (_, list) = api.send(Method::GET, &url, None, "").await;
    assert_eq!(list["kind"], "LeaseList");
    assert_eq!(names(&list), ["a", "c"]);
    assert_eq!(
        list["metadata"]["resourceVersion"],
        api.emulator.revision().to_string()
    );

    let url = format!("{}?labelSelector=app+in+(db)", api.leases("default"));
    assert_eq!(names(&api.send(Method::GET, &url, None, "").await.1), ["b"]);
    let url = format!("{}?fieldSelector=metadata.name%3Db", api.leases("default"));
    assert_eq!(names(&api.send(Method::GET, &url, None, "").await.1), ["b"]);

    let all = format!(
        "{}/apis/coordination.k8s.io/v1/leases?labelSelector=app%3Dweb",
        api.emulator.url()
    );
    assert_eq!(
        names(&api.send(Method::GET, &all, None, "").await.1),
        ["a", "c", "d"]
    );

    let url = format!("{}?limit=2", api.leases("default"));
    let (_, first) = api.send(Method::GET, &url, None, "").await;
    assert_eq!(names(&first), ["a", "b"]);
    assert_eq!(first["metadata"]["remainingItemCount"], 1);
    let token = first["metadata"]["continue"].as_str().unwrap();
    let url = format!("{}?limit=2&continue={token}", api.leases("default"));
    let (_, second) = api.send(Method::GET, &url, None, "").await;
    assert_eq!(names(&second), ["c"]);
    assert!(second["metadata"].get("continue").is_none());
}

const EVENT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

async fn next_event(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buffer: &mut Vec<u8>,
) -> Value {
    loop {
        if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            return serde_json::from_slice(&line).expect("an event is one JSON line");
        }
        // A bound so a missing event fails the test instead of hanging it;
        // generous, since only the absence of an event should reach it.
        let chunk = tokio::time::timeout(EVENT_PATIENCE, stream.next())
            .await
            .expect("an event arrives")
            .expect("the watch stays open")
            .expect("chunk");
        buffer.extend_from_slice(&chunk);
    }
}

#[tokio::test]
async fn watch_streams_changes_after_a_resource_version() {
    let api = Api::start().await;
    let (_, before) = api.create("default", lease("old", "x")).await;
    let url = format!(
        "{}?watch=1&resourceVersion={}&labelSelector=watched",
        api.leases("default"),
        rv(&before)
    );
    let response = api
        .client
        .get(&url)
        .bearer_auth(api.emulator.admin_token())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();

    let mut body = lease("w", "one");
    body["metadata"]["labels"] = json!({"watched": "yes"});
    let (_, created) = api.create("default", body).await;
    api.create("default", lease("unlabelled", "x")).await;
    let mut changed = created.clone();
    changed["spec"]["holderIdentity"] = json!("two");
    let (_, changed) = api.put("default", "w", changed).await;
    // Dropping the label takes the object out of the watch: DELETED.
    let mut unlabelled = changed.clone();
    unlabelled["metadata"]["labels"] = json!({});
    api.put("default", "w", unlabelled).await;

    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "w");
    assert_eq!(event["object"]["kind"], "Lease");
    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["type"], "MODIFIED");
    assert_eq!(event["object"]["spec"]["holderIdentity"], "two");
    assert_eq!(rv(&event["object"]), rv(&changed));
    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["type"], "DELETED");

    // Replaying from the first create gives the same history.
    let url = format!(
        "{}?watch=true&resourceVersion={}&fieldSelector=metadata.name%3Dw",
        api.leases("default"),
        rv(&before)
    );
    let response = api
        .client
        .get(&url)
        .bearer_auth(api.emulator.admin_token())
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let kinds = [
        next_event(&mut stream, &mut buffer).await["type"].clone(),
        next_event(&mut stream, &mut buffer).await["type"].clone(),
        next_event(&mut stream, &mut buffer).await["type"].clone(),
    ];
    assert_eq!(
        kinds,
        [json!("ADDED"), json!("MODIFIED"), json!("MODIFIED")]
    );
    api.send(Method::DELETE, &api.lease("default", "w"), None, "")
        .await;
    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["type"], "DELETED");
    assert!(rv(&event["object"]).parse::<u64>().unwrap() == api.emulator.revision());
}

#[tokio::test]
async fn injected_failures_do_nothing_and_dropped_replies_still_commit() {
    let api = Api::start().await;
    let (_, created) = api.create("default", lease("a", "one")).await;

    api.emulator
        .faults()
        .fail_next(1, Failure::ServiceUnavailable, Some(Verb::Update));
    // A read is not targeted.
    assert_eq!(api.get("default", "a").await.0, StatusCode::OK);
    let mut next = created.clone();
    next["spec"]["holderIdentity"] = json!("two");
    let (status, body) = api.put("default", "a", next.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reason"], "ServiceUnavailable");
    assert_eq!(
        api.get("default", "a").await.1["spec"]["holderIdentity"],
        "one"
    );

    api.emulator
        .faults()
        .fail_next(1, Failure::InternalError, None);
    let (status, body) = api.get("default", "a").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["reason"], "InternalError");
    api.emulator
        .faults()
        .fail_next(1, Failure::GatewayTimeout, None);
    assert_eq!(api.get("default", "a").await.0, StatusCode::GATEWAY_TIMEOUT);

    api.emulator
        .faults()
        .drop_reply_after_commit(1, DroppedReply::Timeout, Some(Verb::Update));
    let (status, body) = api.put("default", "a", next.clone()).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body["reason"], "Timeout");
    let (_, now) = api.get("default", "a").await;
    assert_eq!(now["spec"]["holderIdentity"], "two", "the write committed");

    api.emulator.faults().drop_reply_after_commit(
        1,
        DroppedReply::CloseConnection,
        Some(Verb::Update),
    );
    let mut third = now.clone();
    third["spec"]["holderIdentity"] = json!("three");
    let lost = api
        .client
        .put(api.lease("default", "a"))
        .bearer_auth(api.emulator.admin_token())
        .header("content-type", "application/json")
        .body(third.to_string())
        .send()
        .await;
    assert!(lost.is_err(), "the reply must be lost: {lost:?}");
    let (_, now) = api.get("default", "a").await;
    assert_eq!(
        now["spec"]["holderIdentity"], "three",
        "the write committed"
    );
    assert_eq!(api.emulator.faults().pending(), 0);

    // A failed write does not use up a dropped-reply rule.
    api.emulator
        .faults()
        .drop_reply_after_commit(1, DroppedReply::Timeout, Some(Verb::Update));
    assert_eq!(api.put("default", "a", next).await.0, StatusCode::CONFLICT);
    assert_eq!(api.emulator.faults().pending(), 1);
    api.emulator.faults().clear();
    assert_eq!(api.emulator.faults().pending(), 0);
}

#[tokio::test]
async fn requests_are_counted_per_verb_and_resource() {
    let api = Api::start().await;
    let (_, created) = api.create("default", lease("a", "one")).await;
    api.get("default", "a").await;
    api.get("default", "missing").await;
    api.put("default", "a", created).await;
    api.send(
        Method::GET,
        &format!("{}/version", api.emulator.url()),
        None,
        "",
    )
    .await;
    let counts = api.emulator.requests();
    assert_eq!(counts.get(Verb::Create, "leases"), 1);
    assert_eq!(counts.get(Verb::Get, "leases"), 2);
    assert_eq!(counts.get(Verb::Update, "leases"), 1);
    assert_eq!(counts.resource_total("leases"), 4);
    assert_eq!(counts.non_resource(), 1);
    counts.reset();
    assert_eq!(counts.resource_total("leases"), 0);
    assert!(counts.snapshot().is_empty());
}

#[tokio::test]
async fn finalizers_hold_a_deleted_lease_until_removed() {
    let api = Api::start().await;
    let mut body = lease("f", "x");
    body["metadata"]["finalizers"] = json!(["example.com/keep"]);
    api.create("default", body).await;
    let (status, marked) = api
        .send(Method::DELETE, &api.lease("default", "f"), None, "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    let (_, current) = api.get("default", "f").await;
    let mut cleared = current.clone();
    cleared["metadata"]["finalizers"] = json!([]);
    assert_eq!(api.put("default", "f", cleared).await.0, StatusCode::OK);
    assert_eq!(api.get("default", "f").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_same_port_speaks_tls_with_the_written_authority() {
    let api = Api::start().await;
    let ca = reqwest::Certificate::from_pem(api.emulator.ca_certificate_pem().as_bytes()).unwrap();
    let client = Client::builder()
        .use_rustls_tls()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let version: Value = client
        .get(format!("{}/version", api.emulator.https_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(version["major"], "1");
    let kubeconfig = std::fs::read_to_string(api.emulator.kubeconfig_path()).unwrap();
    assert!(kubeconfig.contains(api.emulator.https_url()));
    assert!(kubeconfig.contains("certificate-authority-data"));
    assert!(kubeconfig.contains(api.emulator.admin_token()));
}
