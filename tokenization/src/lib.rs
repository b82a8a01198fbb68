//! kvroute-tokenization (work in progress).
