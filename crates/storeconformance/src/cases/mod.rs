//! The cases. Each is a public `async fn(&impl StoreFactory)` that panics
//! with a message naming the broken rule and the state the session was in;
//! [`suite!`](crate::suite) turns every one into a test. The rules are
//! those of the `session-store` crate's documentation.

mod authority;
mod basics;
mod fencing;
mod follow;
mod paging;
mod racing;

pub use authority::{authority_binding, racing_first_bindings};
pub use basics::{
    append_and_read_back, bad_input_is_invalid, create_and_exists, session_isolation,
};
pub use fencing::{
    append_after_writes_only_onto_the_log_it_names, delete_is_fenced,
    equal_token_from_another_writer_refused, higher_token_binds_its_writer, lower_token_refused,
    recreated_session_keeps_mark_and_numbers, tokens_compare_exactly, unfenced_refused_once_fenced,
    unfenced_refused_unless_allowed,
};
pub use follow::{
    cancel_requests_wake_the_holder, last_seq_follows_appends,
    wait_on_missing_or_deleted_is_not_found, wait_times_out, wait_wakes_on_append,
};
pub use paging::{
    listing_pages, listing_under_concurrent_changes, paging_under_concurrent_appends, read_paging,
};
pub use racing::{
    racing_equal_tokens_one_writer_wins, racing_lower_and_higher_tokens,
    racing_writers_never_repeat_a_sequence_number,
};
