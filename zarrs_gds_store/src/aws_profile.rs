//! The AWS shared configuration files (`~/.aws/credentials`, `~/.aws/config`) for S3 URLs:
//! object_store reads the `AWS_*` environment, web identity and instance credentials, but not a
//! profile of these files, which `aws configure` writes and boto3, s3fs and the AWS CLI read.
//!
//! Precedence follows botocore's: keys given as options are never replaced; a profile's keys are
//! taken only where no credentials come from elsewhere (the environment's keys, web identity or
//! container credentials) or where the `profile` option (s3fs's) chose the profile; its region
//! and endpoint only where the options and the environment set none. A profile's keys are taken
//! as a group from one section (the credentials file's, else the config file's), never mixed
//! with another source's; a profile whose credentials botocore would get from single sign-on, a
//! role or a process is an error that says so, as is a profile named and found in neither file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Keys of profiles whose credentials botocore takes from elsewhere than the files (before any
/// static keys beside them): single sign-on, assumed roles, a credential process.
const INDIRECT: [&str; 8] = [
    "role_arn",
    "source_profile",
    "credential_source",
    "credential_process",
    "web_identity_token_file",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
];

/// One file's sections: per section name, its top-level keys (lowercased) and values.
type Sections = HashMap<String, HashMap<String, String>>;

/// The sections of an AWS configuration file, parsed as botocore's configparser reads them for
/// what is needed here: `[name]` headers (text after the `]` ignored), `key = value` or
/// `key: value` lines (keys lowercased, the first of a key kept), comment lines (`#`, `;`), and
/// indented lines, which continue the line before (the nested `s3 =` blocks): never a key of
/// the section. No INI crate reads this dialect as botocore does (nested blocks, trailing text
/// after a header, case), hence these few lines.
fn parse(text: &str) -> Sections {
    let mut sections = Sections::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(['#', ';']) || line.starts_with([' ', '\t']) {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            current = rest.split_once(']').map(|(name, _)| name.trim().to_string());
            if let Some(name) = &current {
                sections.entry(name.clone()).or_default();
            }
            continue;
        }
        let (Some(section), Some(at)) = (&current, trimmed.find(['=', ':'])) else { continue };
        let (key, value) = (trimmed[..at].trim().to_ascii_lowercase(), trimmed[at + 1..].trim());
        sections.entry(section.clone()).or_default().entry(key).or_insert_with(|| value.to_string());
    }
    sections
}

/// A file's sections; none where it is missing or cannot be read (as botocore skips it).
fn load(path: &Path) -> Sections {
    std::fs::read_to_string(path).map(|text| parse(&text)).unwrap_or_default()
}

/// A path from the environment, `~` expanded.
fn expand(path: &str, home: Option<&str>) -> PathBuf {
    match (path.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => Path::new(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// A profile as found in the two files.
struct Profile {
    /// Its credentials as a group (object_store's names), from the credentials file's section
    /// if that holds a key, else the config file's.
    credentials: Vec<(String, String)>,
    /// Its region and S3 endpoint (the config file's, else the credentials file's).
    region: Option<String>,
    endpoint: Option<String>,
    /// The first key that makes botocore look elsewhere for its credentials.
    indirect: Option<&'static str>,
}

/// Profile `name` of the files `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` (else
/// `~/.aws/credentials` and `~/.aws/config`); `None` when in neither; and the files, for
/// messages.
fn find(name: &str, env: &dyn Fn(&str) -> Option<String>) -> (Option<Profile>, String) {
    let home = env("HOME");
    let file = |variable: &str, default: &str| {
        env(variable)
            .map(|p| expand(&p, home.as_deref()))
            .or_else(|| home.as_ref().map(|h| Path::new(h).join(".aws").join(default)))
    };
    let (credentials_path, config_path) =
        (file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), file("AWS_CONFIG_FILE", "config"));
    let files = [&credentials_path, &config_path]
        .iter()
        .filter_map(|p| p.as_ref().map(|p| p.display().to_string()))
        .collect::<Vec<_>>()
        .join(" or ");
    let mut credentials_file = credentials_path.as_deref().map(load).unwrap_or_default();
    let mut config_file = config_path.as_deref().map(load).unwrap_or_default();
    let from_credentials = credentials_file.remove(name);
    // The config file names its sections `profile NAME`; `default` may be either.
    let from_config = config_file
        .remove(&format!("profile {name}"))
        .or_else(|| (name == "default").then(|| config_file.remove(name)).flatten());
    if from_credentials.is_none() && from_config.is_none() {
        return (None, files);
    }
    let sections = [from_credentials.unwrap_or_default(), from_config.unwrap_or_default()];
    let keyed = sections.iter().find(|s| s.contains_key("aws_access_key_id"));
    let credentials = keyed.map_or_else(Vec::new, |section| {
        let token = section.get("aws_session_token").or_else(|| section.get("aws_security_token"));
        [
            ("aws_access_key_id", section.get("aws_access_key_id")),
            ("aws_secret_access_key", section.get("aws_secret_access_key")),
            ("aws_session_token", token),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| (k.to_string(), v.clone())))
        .collect()
    });
    let get = |key: &str| sections[1].get(key).or_else(|| sections[0].get(key)).filter(|v| !v.is_empty()).cloned();
    let indirect = INDIRECT.into_iter().find(|k| sections.iter().any(|s| s.contains_key(*k)));
    (Some(Profile { credentials, region: get("region"), endpoint: get("endpoint_url"), indirect }), files)
}

/// `options` (object_store's names) with an AWS profile's settings added as the module says, and
/// the `profile` and `profile_files` options taken out. The profile is the `profile` option's,
/// else `AWS_PROFILE`'s, else `default`. `profile_files=false` reads no file (what a client that
/// never reads them, such as obstore, configured): naming a profile beside it is an error.
pub(crate) fn with_profile(
    mut options: Vec<(String, String)>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let (mut chosen, mut files_off) = (None, None);
    options.retain(|(k, v)| {
        let profile = matches!(k.as_str(), "profile" | "aws_profile");
        if profile && chosen.is_none() {
            chosen = Some(v.clone());
        }
        let files = matches!(k.as_str(), "profile_files" | "aws_profile_files");
        if files {
            files_off = Some(v.clone());
        }
        !profile && !files
    });
    match files_off.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("true") => {}
        Some("false") => {
            return match chosen {
                Some(name) => Err(format!("the AWS profile {name} is named, but profile_files is false")),
                None => Ok(options),
            };
        }
        Some(other) => return Err(format!("profile_files: true or false, not {other:?}")),
    }
    let set = |variable: &str| env(variable).is_some_and(|v| !v.is_empty());
    let option = |names: &[&str]| options.iter().any(|(k, _)| names.contains(&k.trim_start_matches("aws_")));
    let explicit = chosen.is_some();
    let name = chosen.or_else(|| env("AWS_PROFILE")).filter(|n| !n.is_empty());
    let named = name.is_some();
    let name = name.unwrap_or_else(|| "default".to_string());
    let anonymous = options.iter().any(|(k, v)| k.trim_start_matches("aws_") == "skip_signature" && v == "true")
        || env("AWS_SKIP_SIGNATURE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let in_options = option(&["access_key_id", "secret_access_key", "session_token", "token"]);
    // botocore's environment provider needs a key: a token alone there is no credential.
    let in_env = set("AWS_ACCESS_KEY_ID");
    let elsewhere =
        ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"]
            .iter()
            .any(|v| set(v));
    let take_credentials = !anonymous && !in_options && (explicit || !(in_env || elsewhere));
    let region_given = option(&["region", "default_region"]) || set("AWS_REGION") || set("AWS_DEFAULT_REGION");
    let endpoint_given = option(&["endpoint", "endpoint_url"])
        || ["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"].iter().any(|v| set(v))
        || env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    // Nothing the profile could add, and none named: the files are not read.
    if !named && !take_credentials && region_given && endpoint_given {
        return Ok(options);
    }
    let (profile, files) = find(&name, env);
    let Some(profile) = profile else {
        return if named { Err(format!("AWS profile {name} is in neither {files}")) } else { Ok(options) };
    };
    if take_credentials {
        if let Some(key) = profile.indirect {
            return Err(format!(
                "AWS profile {name} takes its credentials through {key}, which this reader does not resolve: \
                 export them first (`aws configure export-credentials --profile {name} --format env`)"
            ));
        }
        let has_token = profile.credentials.iter().any(|(k, _)| k == "aws_session_token");
        if !profile.credentials.is_empty() && set("AWS_SESSION_TOKEN") && !has_token {
            // object_store would send the environment's token with the profile's keys.
            return Err(format!(
                "AWS profile {name} has keys without a session token, but AWS_SESSION_TOKEN in the environment \
                 would be sent with them: unset it, or give the keys as options"
            ));
        }
        options.extend(profile.credentials);
    }
    if let (false, Some(region)) = (region_given, profile.region) {
        options.push(("aws_region".to_string(), region));
    }
    if let (false, Some(endpoint)) = (endpoint_given, profile.endpoint) {
        options.push(("aws_endpoint".to_string(), endpoint));
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Setup {
        dir: tempfile::TempDir,
        env: Vec<(&'static str, String)>,
    }

    impl Setup {
        fn new(credentials: &str, config: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("credentials"), credentials).unwrap();
            std::fs::write(dir.path().join("config"), config).unwrap();
            let env = vec![
                ("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("credentials").display().to_string()),
                ("AWS_CONFIG_FILE", dir.path().join("config").display().to_string()),
            ];
            Self { dir, env }
        }

        fn with(mut self, variable: &'static str, value: &str) -> Self {
            self.env.push((variable, value.to_string()));
            self
        }

        fn run(&self, options: &[(&str, &str)]) -> Result<Vec<(String, String)>, String> {
            let env = |k: &str| self.env.iter().find(|(v, _)| *v == k).map(|(_, value)| value.clone());
            let options = options.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
            let _ = &self.dir;
            with_profile(options, &env)
        }
    }

    fn value<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
        let found: Vec<&str> = options.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect();
        assert!(found.len() <= 1, "{key} set twice: {options:?}");
        found.first().copied()
    }

    const CREDENTIALS_FILE: &str =
        "# keys\n[default] # mine\naws_access_key_id = AKDEFAULT\naws_secret_access_key = secret-default\n\n\
        [bench]\nAWS_ACCESS_KEY_ID=AKBENCH\naws_secret_access_key=secret-bench\naws_session_token = tok==\n\
        [mixed]\naws_access_key_id = AKMIX\naws_secret_access_key = secret-mix\n";
    const CONFIG_FILE: &str = "[default]\nregion = eu-west-1\n\n[profile bench]\nregion = us-east-2\n\
        endpoint_url = http://127.0.0.1:9000\ns3 =\n  endpoint_url = http://nested:1\n  # indented comment\n\n\
        [profile sso]\nsso_session = corp\nregion = eu-north-1\n[sso-session corp]\nsso_region = x\n\
        [profile onlyconfig]\naws_access_key_id = AKCONF\naws_secret_access_key = secret-conf\n\
        [profile mixed]\naws_session_token = CONFIGTOKEN\n\
        [profile roled]\naws_access_key_id = AKROLE\naws_secret_access_key = secret-role\nrole_arn = arn:x\n";

    #[test]
    fn the_default_profile_fills_what_options_and_environment_leave() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKDEFAULT"), "a header with a comment after it");
        assert_eq!(value(&out, "aws_secret_access_key"), Some("secret-default"));
        assert_eq!(value(&out, "aws_region"), Some("eu-west-1"));
        let out = setup.run(&[("aws_region", "ap-south-1")]).unwrap();
        assert_eq!(value(&out, "aws_region"), Some("ap-south-1"));
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKDEFAULT"));
    }

    #[test]
    fn profile_files_false_reads_no_file_and_refuses_a_named_profile() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_PROFILE", "bench");
        let given = [("aws_access_key_id", "AKOPT"), ("aws_secret_access_key", "s"), ("aws_region", "r")];
        let mut options = given.to_vec();
        options.push(("profile_files", "false"));
        let out = setup.run(&options).unwrap();
        let want: Vec<(String, String)> = given.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        assert_eq!(out, want, "nothing added, the option taken out");
        let out = setup.run(&[("profile_files", "False")]).unwrap();
        assert!(out.is_empty(), "no keys, region or endpoint from the files: {out:?}");
        let err = setup.run(&[("profile_files", "false"), ("profile", "bench")]).unwrap_err();
        assert!(err.contains("bench") && err.contains("profile_files"), "{err}");
        assert!(setup.run(&[("profile_files", "no")]).unwrap_err().contains("true or false"));
        assert_eq!(value(&setup.run(&[("profile_files", "true")]).unwrap(), "aws_region"), Some("us-east-2"));
    }

    #[test]
    fn keys_given_as_options_are_never_replaced_nor_mixed() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        for options in [
            &[("profile", "bench"), ("aws_access_key_id", "AKOPT"), ("aws_secret_access_key", "s")][..],
            &[("aws_secret_access_key", "only-a-secret")][..],
        ] {
            let out = setup.run(options).unwrap();
            assert!(out.iter().all(|(_, v)| !v.starts_with("AK") || v == "AKOPT"), "{out:?}");
            assert_eq!(value(&out, "aws_session_token"), None, "{out:?}");
        }
        // The chosen profile's region and endpoint still come (the top-level endpoint_url, not
        // the nested s3 block's).
        let out = setup.run(&[("profile", "bench"), ("aws_access_key_id", "AKOPT")]).unwrap();
        assert_eq!(value(&out, "aws_endpoint"), Some("http://127.0.0.1:9000"));
        assert!(out.iter().all(|(k, _)| k != "profile"), "{out:?}");
    }

    #[test]
    fn environment_credentials_win_over_aws_profile_and_a_chosen_profile_wins_over_them() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE)
            .with("AWS_ACCESS_KEY_ID", "AKENV")
            .with("AWS_SECRET_ACCESS_KEY", "secret-env")
            .with("AWS_PROFILE", "bench");
        let out = setup.run(&[]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), None, "the environment's keys stand");
        assert_eq!(value(&out, "aws_region"), Some("us-east-2"));
        let out = setup.run(&[("profile", "bench")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKBENCH"), "key names are case-insensitive");
        assert_eq!(value(&out, "aws_session_token"), Some("tok=="));
        // Web identity in the environment: no profile keys unless a profile is chosen.
        let irsa = Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_WEB_IDENTITY_TOKEN_FILE", "/t");
        assert_eq!(value(&irsa.run(&[]).unwrap(), "aws_access_key_id"), None);
    }

    #[test]
    fn a_profiles_keys_come_from_one_section_and_never_with_another_token() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[("profile", "mixed")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKMIX"));
        assert_eq!(value(&out, "aws_session_token"), None, "the config file's token is another section's");
        let out = setup.run(&[("profile", "onlyconfig")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKCONF"));
        // A token alone in the environment (no key: no credential there): a profile's keys and
        // token replace it; a profile's keys without a token are refused, not sent with it.
        let token = Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_SESSION_TOKEN", "ENVTOKEN");
        let err = token.run(&[("profile", "mixed")]).unwrap_err();
        assert!(err.contains("AWS_SESSION_TOKEN") && !err.contains("ENVTOKEN"), "{err}");
        let out = token.with("AWS_PROFILE", "bench").run(&[]).unwrap();
        assert_eq!(
            (value(&out, "aws_access_key_id"), value(&out, "aws_session_token")),
            (Some("AKBENCH"), Some("tok=="))
        );
    }

    #[test]
    fn profiles_named_and_missing_or_signing_in_elsewhere_are_errors() {
        let empty = Setup::new("", "");
        assert_eq!(empty.run(&[("x", "y")]).unwrap(), vec![("x".to_string(), "y".to_string())]);
        let err = empty.run(&[("profile", "nope")]).unwrap_err();
        assert!(err.contains("nope") && err.contains("credentials"), "{err}");
        let err = Setup::new("", "").with("AWS_PROFILE", "gone").run(&[]).unwrap_err();
        assert!(err.contains("gone"), "{err}");
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        for (profile, key) in [("sso", "sso_session"), ("roled", "role_arn")] {
            let err = setup.run(&[("profile", profile)]).unwrap_err();
            assert!(err.contains(key) && err.contains("export-credentials") && !err.contains("secret"), "{err}");
        }
        // Credentials from the environment: such a profile gives its region only.
        let with_env =
            Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_PROFILE", "sso").with("AWS_ACCESS_KEY_ID", "AKENV");
        assert_eq!(value(&with_env.run(&[]).unwrap(), "aws_region"), Some("eu-north-1"));
    }

    #[test]
    fn anonymous_access_and_unreadable_files_take_nothing_and_fail_nothing() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[("aws_skip_signature", "true")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), None);
        assert_eq!(value(&out, "aws_region"), Some("eu-west-1"));
        let anonymous =
            Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_SKIP_SIGNATURE", "true").with("AWS_PROFILE", "sso");
        assert!(anonymous.run(&[]).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let env = |k: &str| match k {
            "AWS_SHARED_CREDENTIALS_FILE" | "AWS_CONFIG_FILE" => Some(dir.path().display().to_string()),
            _ => None,
        };
        assert_eq!(with_profile(vec![], &env).unwrap(), vec![]);
    }

    #[test]
    fn the_parser_reads_what_botocore_reads() {
        let sections =
            parse("[a]\nk = v = w\nK2: x\n  nested = n\ns3 =\n\tmax = 1\n[b] ; c\n; note\n#x = y\nk=1\nk=2\n");
        assert_eq!(sections["a"]["k"], "v = w");
        assert_eq!(sections["a"]["k2"], "x");
        assert!(!sections["a"].contains_key("nested") && !sections["a"].contains_key("max"));
        assert_eq!(sections["a"]["s3"], "");
        assert_eq!(sections["b"]["k"], "1");
        assert!(!sections["b"].contains_key("#x"));
    }
}
