//! Integration tests: a scripted SSE server, a model hub, and the shipped
//! bench files. One test binary keeps link time down.

mod harness {
    pub mod hub;
    pub mod launcher;
    pub mod reproduce;
    pub mod scripted;
    pub mod shipped;
}
