//! A server lives as long as the test process, not as long as the thread
//! that started it: the kernel sends the parent-death signal when the
//! thread that forked a child exits, and servers are restarted from
//! threads that end (runtime threads retired when idle, short test
//! threads).

use std::time::{Duration, Instant};

use test_services::RedisServer;

#[test]
fn a_server_started_on_a_thread_that_ends_keeps_running() {
    let redis = std::thread::spawn(RedisServer::start)
        .join()
        .expect("the starting thread")
        .expect("redis starts");
    // Killed, it went within a quarter of a second of the thread's end;
    // three seconds of answers show it was not.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(
            redis.command(&["PING"]).is_ok(),
            "redis died with the thread that started it"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_server_restarted_on_a_thread_that_ends_keeps_running() {
    let mut redis = RedisServer::start().expect("redis starts");
    let redis = std::thread::spawn(move || {
        redis.restart().expect("redis restarts");
        redis
    })
    .join()
    .expect("the restarting thread");
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(
            redis.command(&["PING"]).is_ok(),
            "redis died with the thread that restarted it"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
