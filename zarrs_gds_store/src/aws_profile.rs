//! The AWS shared configuration files (`~/.aws/credentials`, `~/.aws/config`) for S3 URLs:
//! object_store reads the `AWS_*` environment, web identity and instance credentials, but not a
//! profile of these files, which `aws configure` writes and boto3, s3fs and the AWS CLI read.
//! A profile's static keys, session token, region and endpoint become options of the store, in
//! the AWS tools' order: options given, then the environment, then the profile. A profile named
//! as an option (`profile`, as s3fs takes it) is a choice of credentials: its keys win over the
//! environment's; a profile named by `AWS_PROFILE` fills only what the environment does not set.

use std::path::{Path, PathBuf};

use ini::{Ini, ParseOption};

/// The credentials of a profile, as object_store names them (taken or left as a group).
const CREDENTIALS: [&str; 3] = ["aws_access_key_id", "aws_secret_access_key", "aws_session_token"];

/// Keys of profiles whose credentials come from elsewhere than the files (single sign-on,
/// assumed roles, a credential process), which this crate does not resolve.
const INDIRECT: [&str; 5] =
    ["sso_session", "sso_start_url", "role_arn", "credential_process", "web_identity_token_file"];

/// The two files: `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE`, else under `~/.aws`.
struct Files {
    credentials: PathBuf,
    config: PathBuf,
}

impl Files {
    fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let home = env("HOME").map(|h| Path::new(&h).join(".aws"));
        let credentials = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| home.clone().map(|h| h.join("credentials")))?;
        let config = env("AWS_CONFIG_FILE").map(PathBuf::from).or_else(|| home.map(|h| h.join("config")))?;
        Some(Self { credentials, config })
    }

    /// Profile `name` (`None`: in neither file). The credentials file's keys win over the
    /// config file's.
    fn profile(&self, name: &str) -> Result<Option<Profile>, String> {
        let credentials = load(&self.credentials)?;
        let config = load(&self.config)?;
        // The config file names its sections `profile NAME`, but for `default`.
        let config_section = if name == "default" { name.to_string() } else { format!("profile {name}") };
        let from_credentials = credentials.as_ref().and_then(|f| f.section(Some(name)));
        let from_config = config.as_ref().and_then(|f| f.section(Some(config_section.as_str())));
        if from_credentials.is_none() && from_config.is_none() {
            return Ok(None);
        }
        let get = |key: &str| {
            from_credentials.and_then(|s| s.get(key)).or_else(|| from_config.and_then(|s| s.get(key))).map(str::trim)
        };
        let mut out = Vec::new();
        for key in CREDENTIALS {
            if let Some(value) = get(key).filter(|v| !v.is_empty()) {
                out.push((key.to_string(), value.to_string()));
            }
        }
        let indirect = INDIRECT.into_iter().find(|k| get(k).is_some());
        for (file_key, option) in [("region", "aws_region"), ("endpoint_url", "aws_endpoint")] {
            if let Some(value) = get(file_key).filter(|v| !v.is_empty()) {
                out.push((option.to_string(), value.to_string()));
            }
        }
        Ok(Some(Profile { settings: out, indirect }))
    }

    fn describe(&self) -> String {
        format!("{} or {}", self.credentials.display(), self.config.display())
    }
}

/// A profile's settings as object_store options, and the key naming where its credentials come
/// from when the files do not hold them.
struct Profile {
    settings: Vec<(String, String)>,
    indirect: Option<&'static str>,
}

/// A file's sections, `None` where it does not exist. Values are taken as written (no quotes or
/// escapes); a file that does not parse is an error naming its line, never its text.
fn load(path: &Path) -> Result<Option<Ini>, String> {
    let literal = ParseOption { enabled_quote: false, enabled_escape: false, ..ParseOption::default() };
    match std::fs::read_to_string(path) {
        Ok(text) => Ini::load_from_str_opt(&text, literal)
            .map(Some)
            .map_err(|e| format!("{}: not an AWS configuration file (line {})", path.display(), e.line)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("{}: {err}", path.display())),
    }
}

/// `options` (object_store's names) with an AWS profile's settings added where the options and
/// the environment (`env`) leave them unset, and the `profile` option taken out. The profile is
/// the `profile` option's, else `AWS_PROFILE`'s, else `default`; a profile that was named and is
/// in neither file is an error, `default` missing is not. Anonymous access (`aws_skip_signature`)
/// takes no credentials.
pub(crate) fn with_profile(
    mut options: Vec<(String, String)>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let chosen =
        options.iter().position(|(k, _)| matches!(k.as_str(), "profile" | "aws_profile")).map(|i| options.remove(i).1);
    let explicit = chosen.is_some();
    let name = chosen.or_else(|| env("AWS_PROFILE")).filter(|n| !n.is_empty());
    let named = name.is_some();
    let name = name.unwrap_or_else(|| "default".to_string());
    let Some(files) = Files::from_env(env) else {
        return if named { Err(format!("AWS profile {name}: no HOME to find ~/.aws in")) } else { Ok(options) };
    };
    // What the options or the environment already set (object_store's aliases too).
    let given = |names: &[&str], variables: &[&str]| {
        options.iter().any(|(k, _)| names.contains(&k.trim_start_matches("aws_")))
            || variables.iter().any(|v| env(v).is_some_and(|value| !value.is_empty()))
    };
    let anonymous = options.iter().any(|(k, v)| k.trim_start_matches("aws_") == "skip_signature" && v == "true");
    let credentials_given = given(&["access_key_id"], &["AWS_ACCESS_KEY_ID"]);
    let region_given = given(&["region", "default_region"], &["AWS_REGION", "AWS_DEFAULT_REGION"]);
    let endpoint_given = given(&["endpoint", "endpoint_url"], &["AWS_ENDPOINT", "AWS_ENDPOINT_URL"]);
    // The files are read only where the profile could add something.
    let wanted = explicit || (!credentials_given && !anonymous) || !region_given || !endpoint_given;
    if !wanted {
        return Ok(options);
    }
    let Profile { settings, indirect } = match files.profile(&name)? {
        None if named => return Err(format!("AWS profile {name} is in neither {}", files.describe())),
        None => return Ok(options),
        Some(profile) => profile,
    };
    let take_credentials = !anonymous && (explicit || !credentials_given);
    if let (true, Some(key)) = (take_credentials && settings.iter().all(|(k, _)| k != "aws_access_key_id"), indirect) {
        return Err(format!(
            "AWS profile {name} takes its credentials through {key}, which this reader does not resolve: \
             export them first (`aws configure export-credentials --profile {name} --format env`)"
        ));
    }
    if take_credentials && explicit {
        // The profile's credentials replace the options' and the environment's as a group.
        options.retain(|(k, _)| !CREDENTIALS.contains(&k.as_str()));
    }
    for (key, value) in settings {
        let add = if CREDENTIALS.contains(&key.as_str()) {
            take_credentials
        } else if key == "aws_region" {
            !region_given
        } else {
            !endpoint_given
        };
        if add {
            options.push((key, value));
        }
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
        options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    const CREDENTIALS_FILE: &str =
        "# keys\n[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = secret-default\n\n\
        [bench]\naws_access_key_id=AKBENCH\naws_secret_access_key=secret-bench\naws_session_token = tok\n";
    const CONFIG_FILE: &str = "[default]\nregion = eu-west-1\n\n[profile bench]\nregion = us-east-2\n\
        endpoint_url = http://127.0.0.1:9000\ns3 =\n  addressing_style = path\n\n\
        [profile sso]\nsso_session = corp\nregion = eu-north-1\n\n[profile onlyconfig]\naws_access_key_id = AKCONF\n\
        aws_secret_access_key = secret-conf\n";

    #[test]
    fn the_default_profile_fills_what_options_and_environment_leave() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKDEFAULT"));
        assert_eq!(value(&out, "aws_secret_access_key"), Some("secret-default"));
        assert_eq!(value(&out, "aws_region"), Some("eu-west-1"));
        // Options given win, the rest still comes from the profile.
        let out = setup.run(&[("aws_region", "ap-south-1")]).unwrap();
        assert_eq!(value(&out, "aws_region"), Some("ap-south-1"));
        assert_eq!(out.iter().filter(|(k, _)| k == "aws_region").count(), 1);
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKDEFAULT"));
    }

    #[test]
    fn environment_credentials_win_over_aws_profile_but_not_over_a_profile_option() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE)
            .with("AWS_ACCESS_KEY_ID", "AKENV")
            .with("AWS_SECRET_ACCESS_KEY", "secret-env")
            .with("AWS_PROFILE", "bench");
        let out = setup.run(&[]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), None, "the environment's keys stand");
        assert_eq!(value(&out, "aws_region"), Some("us-east-2"));
        assert_eq!(value(&out, "aws_endpoint"), Some("http://127.0.0.1:9000"));
        // s3fs's `profile` option: that profile's credentials, all three, over the environment's.
        let out = setup.run(&[("profile", "bench"), ("aws_access_key_id", "AKOPT")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKBENCH"));
        assert_eq!(value(&out, "aws_session_token"), Some("tok"));
        assert!(out.iter().all(|(k, _)| k != "profile"), "{out:?}");
    }

    #[test]
    fn a_profile_named_and_missing_is_an_error_default_missing_is_not() {
        let setup = Setup::new("", "");
        assert_eq!(setup.run(&[("x", "y")]).unwrap(), vec![("x".to_string(), "y".to_string())]);
        let err = setup.run(&[("profile", "nope")]).unwrap_err();
        assert!(err.contains("nope") && err.contains("credentials"), "{err}");
        let err = Setup::new("", "").with("AWS_PROFILE", "gone").run(&[]).unwrap_err();
        assert!(err.contains("gone"), "{err}");
    }

    #[test]
    fn keys_in_the_config_file_count_and_indirect_credentials_are_named_not_guessed() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[("profile", "onlyconfig")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), Some("AKCONF"));
        let err = setup.run(&[("profile", "sso")]).unwrap_err();
        assert!(err.contains("sso_session") && err.contains("export-credentials"), "{err}");
        // Credentials from the environment: a profile of that kind only gives nothing more.
        let with_env =
            Setup::new(CREDENTIALS_FILE, CONFIG_FILE).with("AWS_PROFILE", "sso").with("AWS_ACCESS_KEY_ID", "AKENV");
        assert!(with_env.run(&[]).is_ok());
    }

    #[test]
    fn anonymous_access_takes_no_credentials_and_secrets_stay_out_of_errors() {
        let setup = Setup::new(CREDENTIALS_FILE, CONFIG_FILE);
        let out = setup.run(&[("aws_skip_signature", "true")]).unwrap();
        assert_eq!(value(&out, "aws_access_key_id"), None);
        assert_eq!(value(&out, "aws_region"), Some("eu-west-1"));
        let broken = Setup::new("[default\naws_secret_access_key = hunter2\n", "");
        if let Err(err) = broken.run(&[]) {
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
