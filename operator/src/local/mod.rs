//! Local mode: the SLA loop over engine processes on one machine, with manifests checked by
//! the CRD's own schema and rules ([`validate`]).
pub mod validate;
