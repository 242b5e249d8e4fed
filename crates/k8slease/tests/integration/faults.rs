//! What the API server and other writers can do to a lease, against the
//! emulator: replies lost after a committed write, server faults, slow
//! answers, outside edits, out-of-band deletion, missing RBAC verbs.

use std::sync::Arc;
use std::time::Duration;

use k8s_emulator::{DroppedReply, Failure, Verb};
use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8slease::{ExpiryJudgement, K8sLease, object_name};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use lease_port::{LeaseErrorKind, ManualClock, OwnerId, SessionId, SessionLease};

use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(10);
const TOKEN: &str = "mecatl.dev/fencing-token";

fn ids(session: &str) -> (SessionId, OwnerId, OwnerId) {
    (
        SessionId::new(session).unwrap(),
        OwnerId::new("owner-a").unwrap(),
        OwnerId::new("owner-b").unwrap(),
    )
}

async fn lease(cluster: &Cluster) -> K8sLease {
    cluster.lease(TTL, ExpiryJudgement::SkewSafe).await
}

async fn stored(cluster: &Cluster, session: &SessionId) -> LeaseObject {
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    api.get(&object_name(session))
        .await
        .expect("the object exists")
}

fn stored_token(object: &LeaseObject) -> u64 {
    object.metadata.annotations.as_ref().unwrap()[TOKEN]
        .parse()
        .unwrap()
}

fn holder(object: &LeaseObject) -> Option<&str> {
    object.spec.as_ref()?.holder_identity.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_whose_reply_is_lost_is_found_committed() {
    for how in [DroppedReply::CloseConnection, DroppedReply::Timeout] {
        let cluster = Cluster::emulated().await;
        let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
        let (s, a, b) = ids("dropped-takeover");
        let first = cb.acquire(&s, &b).await.unwrap();
        cb.release(&first).await.unwrap();

        cluster
            .emulator()
            .faults()
            .drop_reply_after_commit(1, how, Some(Verb::Update));
        let won = ca
            .acquire(&s, &a)
            .await
            .expect("the committed takeover is ours");
        assert_eq!(
            cluster.emulator().faults().pending(),
            0,
            "{how:?} never fired"
        );
        assert!(won.token() > first.token());
        let object = stored(&cluster, &s).await;
        assert_eq!(holder(&object), Some("owner-a"));
        assert_eq!(stored_token(&object), won.token().get(), "{how:?}");
        let err = cb.acquire(&s, &b).await.unwrap_err();
        assert_eq!(err.kind(), LeaseErrorKind::Held);
        assert_eq!(err.holder(), Some(&a));
        assert_eq!(ca.renew(&won).await.unwrap().token(), won.token());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_whose_reply_is_lost_is_found_committed() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("dropped-create");
    // The client's owner lease exists already: the create that loses its
    // reply is the session object's.
    let warm = SessionId::new("dropped-create-warm").unwrap();
    ca.acquire(&warm, &a).await.unwrap();
    cluster.emulator().faults().drop_reply_after_commit(
        1,
        DroppedReply::CloseConnection,
        Some(Verb::Create),
    );
    let won = ca
        .acquire(&s, &a)
        .await
        .expect("the committed create is ours");
    assert_eq!(cluster.emulator().faults().pending(), 0);
    let object = stored(&cluster, &s).await;
    assert_eq!(holder(&object), Some("owner-a"));
    assert_eq!(stored_token(&object), won.token().get());
    assert_eq!(
        cb.acquire(&s, &b).await.unwrap_err().holder(),
        Some(&a),
        "b must find a holding"
    );
    ca.renew(&won)
        .await
        .expect("a renews the lease it was granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_release_whose_reply_is_lost() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("dropped-renew");
    let held = ca.acquire(&s, &a).await.unwrap();
    let faults = cluster.emulator().faults();

    faults.drop_reply_after_commit(1, DroppedReply::Timeout, Some(Verb::Update));
    let renewed = ca.renew(&held).await.expect("a renewal that committed");
    assert_eq!(faults.pending(), 0);
    assert_eq!(renewed.token(), held.token());
    assert_eq!(holder(&stored(&cluster, &s).await), Some("owner-a"));

    faults.drop_reply_after_commit(1, DroppedReply::CloseConnection, Some(Verb::Update));
    ca.release(&renewed)
        .await
        .expect("a release that committed");
    assert_eq!(faults.pending(), 0);
    assert_eq!(holder(&stored(&cluster, &s).await), None);
    let next = cb.acquire(&s, &b).await.expect("free after the release");
    assert!(next.token() > held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_faults_are_retried_or_transient_with_source() {
    let cluster = Cluster::emulated().await;
    let ca = lease(&cluster).await;
    let (s, a, _) = ids("faults");
    let faults = cluster.emulator().faults();

    // One failed write: it may have landed, so it is re-read and retried.
    let held = ca.acquire(&s, &a).await.unwrap();
    faults.fail_next(1, Failure::ServiceUnavailable, Some(Verb::Update));
    ca.renew(&held)
        .await
        .expect("one 503 on a write is retried");

    // A failed read is reported at once.
    let other = SessionId::new("faults-read").unwrap();
    faults.fail_next(1, Failure::InternalError, Some(Verb::Get));
    let err = ca.acquire(&other, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(std::error::Error::source(&err).is_some());

    // Every write failing: Transient, with the last cause.
    faults.fail_next(100, Failure::GatewayTimeout, Some(Verb::Update));
    let err = ca.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    faults.clear();
    ca.renew(&held).await.expect("renews once the faults pass");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_slower_than_the_request_timeout_is_transient() {
    let cluster = Cluster::emulated().await;
    let c = K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(Duration::from_secs(3))
        .request_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let (s, a, _) = ids("slow");
    cluster
        .emulator()
        .faults()
        .set_latency(Duration::from_secs(2));
    let err = c.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(err.message().contains("no answer within"), "{err}");
    cluster.emulator().faults().clear();
    c.acquire(&s, &a)
        .await
        .expect("acquires once answers are quick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_edit_of_the_holder_loses_the_lease_at_the_next_renew() {
    let cluster = Cluster::emulated().await;
    let ca = lease(&cluster).await;
    let (s, a, _) = ids("edited");
    let held = ca.acquire(&s, &a).await.unwrap();

    // As `kubectl edit` would: read, change, write back under the version.
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let mut object = api.get(&object_name(&s)).await.unwrap();
    object.spec.as_mut().unwrap().holder_identity = Some("operator".into());
    api.replace(&object_name(&s), &PostParams::default(), &object)
        .await
        .unwrap();

    let err = ca.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder().map(OwnerId::as_str), Some("operator"));
    // Its late release leaves the operator's hold alone.
    ca.release(&held).await.unwrap();
    assert_eq!(holder(&stored(&cluster, &s).await), Some("operator"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_reports_the_granted_token_after_an_outside_edit() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("labelled");
    // A new session: the grant that creates its object.
    let held = ca.acquire(&s, &a).await.unwrap();

    // `kubectl label`: read, change, write back under the version.
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let mut object = api.get(&object_name(&s)).await.unwrap();
    object
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "a".into());
    api.replace(&object_name(&s), &PostParams::default(), &object)
        .await
        .unwrap();
    // `kubectl annotate`: a merge patch.
    let mut patch = LeaseObject::default();
    patch.metadata.annotations = Some([("example.com/note".to_owned(), "hi".to_owned())].into());
    api.patch(
        &object_name(&s),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();

    // Every reader reports the token granted, not the object's version.
    let never_saw_it = lease(&cluster).await;
    for (who, client) in [("holder", &ca), ("other", &cb), ("new", &never_saw_it)] {
        let shown = client.current(&s).await.unwrap().expect("held");
        assert_eq!(shown.owner(), &a, "{who}");
        assert_eq!(shown.token(), held.token(), "{who}");
    }
    assert_eq!(
        stored_token(&stored(&cluster, &s).await),
        held.token().get()
    );

    let renewed = ca.renew(&held).await.expect("an edit is no loss");
    assert_eq!(renewed.token(), held.token());
    ca.release(&renewed).await.unwrap();
    let next = cb.acquire(&s, &b).await.unwrap();
    assert!(next.token() > held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_without_a_stated_token_is_never_reported_with_a_guess() {
    let cluster = Cluster::emulated().await;
    let (s, a, b) = ids("unstated");
    // Held by hand (or by an older k8slease's create): no token annotation.
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let mut object = LeaseObject::default();
    object.metadata.name = Some(object_name(&s));
    object.metadata.annotations =
        Some([("mecatl.dev/session-id".to_owned(), s.as_str().to_owned())].into());
    object.spec = Some(LeaseSpec {
        holder_identity: Some(a.as_str().to_owned()),
        lease_duration_seconds: Some(10),
        ..LeaseSpec::default()
    });
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    let version: u64 = created
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();

    let clock = ManualClock::new();
    let cb = K8sLease::builder(cluster.kube().await, &cluster.namespace)
        .ttl(TTL)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let err = cb.current(&s).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Transient, "{err:?}");
    assert!(err.message().contains("token is unknown"), "{err}");
    let err = cb.acquire(&s, &b).await.unwrap_err();
    assert_eq!(err.holder(), Some(&a), "a live holder all the same");

    clock.advance(TTL + Duration::from_secs(1));
    assert_eq!(cb.current(&s).await.unwrap(), None, "lapsed");
    let taken = cb.acquire(&s, &b).await.expect("takeover after expiry");
    assert!(taken.token().get() > version);
    let shown = cb.current(&s).await.unwrap().expect("held by b");
    assert_eq!(shown.token(), taken.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_we_do_not_own_survive_our_writes() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("foreign-fields");
    let held = ca.acquire(&s, &a).await.unwrap();

    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let mut object = api.get(&object_name(&s)).await.unwrap();
    let spec = object.spec.as_mut().unwrap();
    spec.strategy = Some("OldestEmulationVersion".into());
    spec.preferred_holder = Some("someone".into());
    object
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("example.com/note".into(), "keep me".into());
    object
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "a".into());
    api.replace(&object_name(&s), &PostParams::default(), &object)
        .await
        .unwrap();

    // An edit of fields we do not own is no loss.
    let renewed = ca.renew(&held).await.expect("renew after a foreign edit");
    ca.release(&renewed).await.unwrap();
    let next = cb.acquire(&s, &b).await.unwrap();
    assert!(next.token() > held.token());

    let after = stored(&cluster, &s).await;
    let spec = after.spec.as_ref().unwrap();
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    assert_eq!(spec.preferred_holder.as_deref(), Some("someone"));
    assert_eq!(
        after.metadata.annotations.as_ref().unwrap()["example.com/note"],
        "keep me"
    );
    assert_eq!(after.metadata.labels.as_ref().unwrap()["team"], "a");
    assert_eq!(
        after.metadata.annotations.as_ref().unwrap()["mecatl.dev/session-id"],
        s.as_str()
    );
    assert_eq!(
        after.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "mecatl-k8slease"
    );
    // One change of holder since the create: b after a.
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_transitions_count_changes_of_holder() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("transitions");
    let mut expected = 0;
    for round in 0..3 {
        let la = ca.acquire(&s, &a).await.unwrap();
        if round > 0 {
            expected += 1;
        }
        let la = ca.renew(&la).await.unwrap();
        ca.release(&la).await.unwrap();
        let lb = cb.acquire(&s, &b).await.unwrap();
        expected += 1;
        cb.release(&lb).await.unwrap();
        let object = stored(&cluster, &s).await;
        assert_eq!(object.spec.unwrap().lease_transitions, Some(expected));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_restart_after_out_of_band_deletion() {
    let cluster = Cluster::emulated().await;
    let (ca, cb, cc) = (
        lease(&cluster).await,
        lease(&cluster).await,
        lease(&cluster).await,
    );
    let (s, a, b) = ids("deleted");
    let c = OwnerId::new("owner-c").unwrap();
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let delete = || async {
        api.delete(&object_name(&s), &DeleteParams::default())
            .await
            .expect("delete the object")
    };

    let mut issued = Vec::new();
    for _ in 0..3 {
        let l = ca.acquire(&s, &a).await.unwrap();
        issued.push(l.token());
        ca.release(&l).await.unwrap();
    }
    let lb = cb.acquire(&s, &b).await.unwrap();
    issued.push(lb.token());

    // Deleted while b holds it; nobody recreates it before b renews.
    delete().await;
    let err = cb.renew(&lb).await.unwrap_err();
    assert_eq!(
        err.kind(),
        LeaseErrorKind::Held,
        "b lost its lease with the object"
    );
    // b's renewal left nothing held behind it.
    let lc = cc.acquire(&s, &c).await.expect("free after the deletion");
    assert!(
        issued.iter().all(|t| lc.token() > *t),
        "token {} after deletion is not above {issued:?}",
        lc.token()
    );
    issued.push(lc.token());

    // Deleted while c holds it; a client that remembers the old object
    // acquires it anew.
    delete().await;
    let la = ca
        .acquire(&s, &a)
        .await
        .expect("acquire the recreated object");
    assert!(
        issued.iter().all(|t| la.token() > *t),
        "token {} of the recreated object is not above {issued:?}",
        la.token()
    );
    let err = cc.renew(&lc).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder(), Some(&a));
    ca.renew(&la).await.expect("the new holder renews");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_while_held_is_lost_and_never_brought_back() {
    let cluster = Cluster::emulated().await;
    let (ca, cb) = (lease(&cluster).await, lease(&cluster).await);
    let (s, a, b) = ids("deleted-while-held");
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let held = ca.acquire(&s, &a).await.unwrap();
    let held = ca.renew(&held).await.unwrap();

    // `kubectl delete lease`: no preconditions.
    api.delete(&object_name(&s), &DeleteParams::default())
        .await
        .expect("delete the object");
    let counts = cluster.emulator().requests();
    counts.reset();
    let err = ca.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held, "{err:?}");
    // The renewal's write names the deleted object's uid: the API server
    // refuses it instead of creating a new object from it.
    assert!(
        api.get_opt(&object_name(&s)).await.unwrap().is_none(),
        "the holder's renewal brought the deleted object back"
    );
    assert_eq!(counts.get(Verb::Create, "leases"), 0);

    let lb = cb.acquire(&s, &b).await.expect("free after the deletion");
    assert!(lb.token() > held.token());
    // The old holder stays out, whatever it tries.
    let err = ca.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Held);
    assert_eq!(err.holder(), Some(&b));
    let err = ca.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.holder(), Some(&b));
    ca.release(&held).await.unwrap();
    assert_eq!(holder(&stored(&cluster, &s).await), Some("owner-b"));
    cb.renew(&lb).await.expect("the one holder renews");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_rbac_verb_names_verb_and_resource() {
    let cluster = Cluster::emulated().await;
    let emulator = cluster.emulator();
    let user = "system:serviceaccount:default:mecatl";
    let kubeconfig = emulator.kubeconfig_for(user).unwrap();
    emulator
        .rbac()
        .allow(user, &[Verb::Get, Verb::Create], "leases");
    let client = k8slease::client_from_kubeconfig(&kubeconfig).await.unwrap();
    let c = K8sLease::builder(client, &cluster.namespace)
        .ttl(TTL)
        .build()
        .unwrap();
    let (s, a, _) = ids("rbac");

    // get and create make the object; taking it needs update, as renewing
    // does.
    let err = c.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert!(!err.is_retryable());
    let text = err.to_string();
    assert!(
        text.contains("update leases.coordination.k8s.io"),
        "the error must name the verb and resource: {text}"
    );
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(holder(&stored(&cluster, &s).await), None, "nothing is held");
    emulator.rbac().allow(user, &[Verb::Update], "leases");
    let held = c.acquire(&s, &a).await.expect("get, create and update");
    emulator.rbac().revoke(user, &[Verb::Update], "leases");
    let err = c.renew(&held).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert!(
        err.to_string()
            .contains("update leases.coordination.k8s.io")
    );

    // Update back (the owner lease is renewed first), get refused.
    emulator.rbac().allow(user, &[Verb::Update], "leases");
    emulator.rbac().revoke(user, &[Verb::Get], "leases");
    let other = SessionId::new("rbac-other").unwrap();
    let err = c.acquire(&other, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert!(
        err.to_string().contains("get leases.coordination.k8s.io"),
        "{err}"
    );

    // Batch renewal lists the sessions on the owner lease.
    emulator.rbac().allow(user, &[Verb::Get], "leases");
    let err = c.renew_many(std::slice::from_ref(&held)).await.remove(0);
    let err = err.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert!(
        err.to_string().contains("list leases.coordination.k8s.io"),
        "{err}"
    );

    // The Role the README gives is enough for everything.
    emulator.rbac().allow(
        user,
        &[Verb::Get, Verb::List, Verb::Create, Verb::Update],
        "leases",
    );
    let held = c.renew(&held).await.expect("renew with update granted");
    let held = c
        .renew_many(std::slice::from_ref(&held))
        .await
        .remove(0)
        .expect("batch renewal with list granted");
    c.release(&held).await.unwrap();
    c.authority()
        .await
        .expect("the authority needs only lease verbs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_object_under_our_name_is_left_alone() {
    let cluster = Cluster::emulated().await;
    let c = lease(&cluster).await;
    let (s, a, _) = ids("foreign");
    let api: Api<LeaseObject> = Api::namespaced(cluster.kube().await, &cluster.namespace);
    let mut foreign = LeaseObject::default();
    foreign.metadata.name = Some(object_name(&s));
    api.create(&PostParams::default(), &foreign).await.unwrap();
    let err = c.acquire(&s, &a).await.unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::Invalid, "{err:?}");
    assert_eq!(holder(&stored(&cluster, &s).await), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_is_per_namespace_and_cluster() {
    let one = Cluster::emulated().await;
    let two = Cluster::emulated().await;
    let a1 = lease(&one).await.authority().await.unwrap();
    let a1_again = lease(&one).await.authority().await.unwrap();
    let a2 = lease(&two).await.authority().await.unwrap();
    assert_eq!(a1, a1_again);
    assert_ne!(a1, a2, "two clusters with the same namespace name");
    one.emulator().add_namespace("other");
    let other = K8sLease::builder(one.kube().await, "other")
        .ttl(TTL)
        .build()
        .unwrap();
    assert_ne!(other.authority().await.unwrap(), a1, "two namespaces");
}
