//! A certificate authority of the test's own, for services and clients
//! speaking TLS on loopback.

/// A self-signed CA that issues certificates for `127.0.0.1` and
/// `localhost`. Each [`Pki::new`] is a new, unrelated authority: one test
/// can hold a trusted and a foreign one side by side.
///
/// Generating a key or signing with it only fails on a bug of the
/// generator, so these panic rather than return an error.
pub struct Pki {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    /// The CA certificate, PEM.
    pub ca_pem: String,
}

/// A certificate and its private key, both PEM.
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of test output.
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl Pki {
    /// A new authority whose certificate carries `name` as its common name.
    pub fn new(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("CA key");
        let ca_pem = params.self_signed(&key).expect("self-signed CA").pem();
        Pki {
            params,
            key,
            ca_pem,
        }
    }

    /// A certificate for `127.0.0.1` and `localhost` with `common_name`,
    /// usable by a server and by a client.
    pub fn issue(&self, common_name: &str) -> Issued {
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("leaf params");
        self.sign(params, common_name)
    }

    /// A client certificate whose only subject alternative names are the
    /// URI `uri` and the DNS names `dns`: an identity a service can tell
    /// apart from every other client's.
    pub fn issue_client(&self, common_name: &str, uri: Option<&str>, dns: &[&str]) -> Issued {
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .expect("client params");
        if let Some(uri) = uri {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(uri).expect("an ASCII URI"),
            ));
        }
        self.sign(params, common_name)
    }

    fn sign(&self, mut params: rcgen::CertificateParams, common_name: &str) -> Issued {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("signed leaf");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
