//! kvroute-crds (work in progress).
