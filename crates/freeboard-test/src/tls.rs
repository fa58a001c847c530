//! A test certificate authority made at test time with `rcgen`: no key or certificate is
//! checked in, and every run trusts a CA nobody else has.

use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PublicKeyData,
};

/// A CA and one server certificate it signed (for `localhost`, `127.0.0.1` and `::1`), as PEM
/// files in a fresh directory that is removed on drop.
pub struct TestCa {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The base64 SHA-256 of the server certificate's public key (its SPKI), the form
    /// Chromium's `--ignore-certificate-errors-spki-list` takes.
    pub spki_sha256: String,
}

impl TestCa {
    /// A new CA named `name`, and a server certificate from it.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "freeboard-tls-{}-{}-{:x}",
            name,
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, format!("freeboard test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let ca = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca.pem");
        let issuer = Issuer::new(params, key);
        let mut ca = Self { dir, issuer, spki_sha256: String::new() };
        ca.issue("server");
        ca
    }

    /// Signs a new server certificate (and key) for localhost, 127.0.0.1 and ::1, and writes
    /// them over `cert.pem` (the chain: leaf, then the CA) and `key.pem`.
    pub fn issue(&mut self, common_name: &str) {
        self.issue_for(common_name, &["localhost", "127.0.0.1", "::1"]);
    }

    /// As [`issue`](Self::issue), for the subject alternative `names` (DNS names or IP
    /// addresses).
    pub fn issue_for(&mut self, common_name: &str, names: &[&str]) {
        self.issue_with(common_name, names, |_| {});
    }

    /// As [`issue`](Self::issue), with a certificate that expired at the end of 2021.
    pub fn issue_expired(&mut self, common_name: &str) {
        self.issue_with(common_name, &["localhost", "127.0.0.1", "::1"], |params| {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 12, 31);
        });
    }

    fn issue_with(
        &mut self,
        common_name: &str,
        names: &[&str],
        change: impl FnOnce(&mut CertificateParams),
    ) {
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("server params");
        params.distinguished_name.push(DnType::CommonName, common_name);
        change(&mut params);
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.issuer).expect("server certificate");
        let ca = std::fs::read_to_string(self.ca_pem()).expect("read ca.pem");
        std::fs::write(self.cert_pem(), format!("{}{}", cert.pem(), ca)).expect("write cert");
        std::fs::write(self.key_pem(), key.serialize_pem()).expect("write key");
        let spki = key.subject_public_key_info();
        let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
        self.spki_sha256 = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    }

    /// The CA certificate (what a client trusts).
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The server's certificate chain.
    pub fn cert_pem(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    /// The server's private key.
    pub fn key_pem(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u64 {
    let mut bytes = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("rng");
    u64::from_le_bytes(bytes)
}
