//! The helpers start real servers, keep them apart, and leave nothing behind.

use std::net::TcpStream;

use nix::sys::signal::kill;
use nix::unistd::Pid;
use test_services::{Controls, EtcdServer, RedisServer, ServiceError, find_binary};

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(i32::try_from(pid).expect("pid")), None).is_ok()
}

#[test]
fn redis_answers_and_forgets_everything_on_restart() {
    let mut redis = RedisServer::start().expect("start redis");
    assert_eq!(redis.command(&["SET", "k", "v"]).unwrap(), "+OK");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$1\r\nv");
    redis.restart().expect("restart");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$-1");
}

#[test]
fn persistent_redis_keeps_acknowledged_writes_across_a_crash() {
    let mut redis = RedisServer::start_persistent().expect("start redis");
    assert_eq!(redis.command(&["INCR", "token"]).unwrap(), ":1");
    assert_eq!(redis.command(&["INCR", "token"]).unwrap(), ":2");
    redis.kill();
    assert!(
        redis.command(&["PING"]).is_err(),
        "a killed server answers nothing"
    );
    redis.restart().expect("restart");
    assert_eq!(redis.command(&["INCR", "token"]).unwrap(), ":3");
}

#[test]
fn persistent_redis_restarted_from_a_snapshot_forgets_what_came_after_it() {
    let mut redis = RedisServer::start_persistent().expect("start redis");
    assert_eq!(redis.command(&["SET", "k", "old"]).unwrap(), "+OK");
    let snapshot = redis.snapshot().expect("snapshot");
    assert!(snapshot.path().is_file());
    assert_eq!(redis.command(&["SET", "k", "new"]).unwrap(), "+OK");
    assert_eq!(redis.command(&["SET", "later", "1"]).unwrap(), "+OK");
    // Runtime configuration goes back to the start-up one, too.
    redis
        .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .unwrap();
    redis
        .restart_from(&snapshot)
        .expect("restart from the snapshot");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$3\r\nold");
    assert_eq!(redis.command(&["GET", "later"]).unwrap(), "$-1");
    assert_eq!(
        redis.info("memory").unwrap()["maxmemory_policy"],
        "noeviction"
    );
    // Still persistent: what is written after the restore survives a crash,
    // and so does the snapshot's data.
    assert_eq!(redis.command(&["SET", "after", "2"]).unwrap(), "+OK");
    redis.kill();
    redis.restart().expect("restart");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$3\r\nold");
    assert_eq!(redis.command(&["GET", "after"]).unwrap(), "$1\r\n2");
    // The same snapshot serves again.
    redis
        .restart_from(&snapshot)
        .expect("restart from it again");
    assert_eq!(redis.command(&["GET", "after"]).unwrap(), "$-1");
}

#[test]
fn redis_without_persistence_restarts_from_a_snapshot_then_empty() {
    let mut redis = RedisServer::start().expect("start redis");
    assert_eq!(redis.command(&["SET", "k", "old"]).unwrap(), "+OK");
    let snapshot = redis.snapshot().expect("snapshot");
    assert_eq!(redis.command(&["SET", "k", "new"]).unwrap(), "+OK");
    redis
        .restart_from(&snapshot)
        .expect("restart from the snapshot");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$3\r\nold");
    // Taking a snapshot leaves nothing a plain restart would load.
    redis.snapshot().expect("another snapshot");
    redis.restart().expect("restart");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$-1");
}

#[test]
fn redis_info_reads_fields_of_a_section() {
    let redis = RedisServer::start().expect("start redis");
    let memory = redis.info("memory").expect("INFO memory");
    assert!(
        memory["used_memory"].parse::<u64>().unwrap() > 0,
        "{memory:?}"
    );
    let stats = redis.info("stats").expect("INFO stats");
    assert_eq!(stats["evicted_keys"], "0");
}

#[test]
fn paused_redis_answers_only_after_resume() {
    let redis = RedisServer::start().expect("start redis");
    redis.pause().unwrap();
    assert!(
        redis.command(&["PING"]).is_err(),
        "a stopped server must not answer"
    );
    redis.resume().unwrap();
    assert_eq!(redis.command(&["PING"]).unwrap(), "+PONG");
}

#[test]
fn two_redis_servers_share_nothing() {
    let a = RedisServer::start().expect("start redis");
    let b = RedisServer::start().expect("start redis");
    assert_ne!(a.addr(), b.addr());
    a.command(&["SET", "k", "a"]).unwrap();
    assert_eq!(b.command(&["GET", "k"]).unwrap(), "$-1");
}

#[test]
fn dropping_redis_stops_it() {
    let redis = RedisServer::start().expect("start redis");
    let (pid, addr) = (redis.pid().expect("running"), redis.addr());
    assert!(alive(pid));
    drop(redis);
    assert!(!alive(pid), "redis-server {pid} still runs after drop");
    assert!(TcpStream::connect(addr).is_err(), "{addr} still accepts");
}

#[test]
fn etcd_stores_through_its_gateway_and_keeps_data_across_a_crash() {
    let mut etcd = EtcdServer::start().expect("start etcd");
    // key "foo", value "bar", base64 as the gateway wants.
    let put = etcd
        .post("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#)
        .expect("put");
    assert!(put.contains("\"revision\""), "{put}");
    etcd.kill();
    etcd.restart().expect("restart");
    let got = etcd
        .post("/v3/kv/range", r#"{"key":"Zm9v"}"#)
        .expect("range");
    assert!(got.contains("\"value\":\"YmFy\""), "{got}");
}

#[test]
fn dropping_etcd_stops_it() {
    let etcd = EtcdServer::start().expect("start etcd");
    let (pid, addr) = (etcd.pid().expect("running"), etcd.addr());
    drop(etcd);
    assert!(!alive(pid), "etcd {pid} still runs after drop");
    assert!(TcpStream::connect(addr).is_err(), "{addr} still accepts");
}

#[test]
fn a_missing_binary_names_its_package() {
    let err = find_binary(
        "mecatl-no-such-server",
        "mecatl-no-such-package",
        "MECATL_TEST_UNSET_VAR",
    )
    .expect_err("nothing of that name is installed");
    assert!(matches!(err, ServiceError::NotInstalled { .. }));
    let message = err.to_string();
    assert!(message.contains("mecatl-no-such-package"), "{message}");
    assert!(message.contains("cargo xtask services"), "{message}");
}

#[test]
fn etcd_cluster_elects_a_new_leader_and_survives_a_full_restart() {
    use test_services::{CLUSTER_SIZE, EtcdCluster};
    let mut cluster = EtcdCluster::start().expect("start a cluster");
    assert_eq!(cluster.endpoints().len(), CLUSTER_SIZE);
    let old = cluster.wait_for_leader().expect("a leader");
    cluster.kill(old);
    assert!(cluster.process(old).is_none());
    let new = cluster.wait_for_leader().expect("a new leader");
    assert_ne!(new, old, "a killed member cannot lead");
    cluster.start_member(old).expect("the old leader rejoins");
    cluster.restart_all().expect("restart every member");
    cluster
        .wait_for_leader()
        .expect("a leader after the restart");
    for i in 0..CLUSTER_SIZE {
        let pid = cluster.process(i).and_then(|p| p.pid()).expect("running");
        assert!(alive(pid));
    }
}
