//! What every benchmark's command line shares: `--scenario` (scenario names or `all`, the flag
//! repeated or a comma list; the chosen ones run in the benchmark's own order, each once), and
//! a run's configuration whose defaults are its flags' defaults.

use clap::{Args, Command, FromArgMatches};

/// A benchmark's scenarios: a closed set, each with the name `--scenario` and the report use.
pub trait Named: Copy + PartialEq + 'static {
    /// Every scenario, in the order `all` runs them.
    const ALL: &'static [Self];

    fn name(self) -> &'static str;
}

/// `impl Display` for a [`Named`] type: it shows as its name (logs, log file names, errors).
macro_rules! display_by_name {
    ($t:ty) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::harness::cli::Named::name(*self))
            }
        }
    };
}
pub(crate) use display_by_name;

/// The scenario called `name`; the error names it and lists the choices.
pub fn parse<S: Named>(name: &str) -> Result<S, String> {
    S::ALL
        .iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = S::ALL.iter().map(|s| s.name()).collect();
            format!(
                "--scenario {name:?}: want one of {}, all (or a comma list)",
                names.join(", ")
            )
        })
}

/// `--scenario` values → the scenarios in [`Named::ALL`]'s order, each once, and whether `all`
/// was among them.
pub fn select<S: Named>(values: &[String]) -> Result<(Vec<S>, bool), String> {
    let mut chosen = Vec::new();
    let mut all = false;
    for v in values.iter().flat_map(|v| v.split(',')).map(str::trim) {
        match v {
            "" => {}
            "all" => {
                all = true;
                chosen.extend_from_slice(S::ALL);
            }
            name => chosen.push(parse(name)?),
        }
    }
    if chosen.is_empty() {
        return Err("--scenario: no scenario given".into());
    }
    let ordered = S::ALL
        .iter()
        .copied()
        .filter(|s| chosen.contains(s))
        .collect();
    Ok((ordered, all))
}

/// A configuration that is also a flag group, as the command line gives it with only `required`
/// (its required flags): a library caller's `Default` is then the CLI's default, written once.
pub fn defaults<A: Args + FromArgMatches>(required: &[&str]) -> A {
    let cmd = A::augment_args(Command::new("defaults").no_binary_name(true));
    let parsed = cmd
        .try_get_matches_from(required)
        .and_then(|m| A::from_arg_matches(&m));
    // Invariant: only the flag definitions decide this, and each benchmark's tests build its
    // default configuration.
    #[allow(clippy::expect_used)]
    parsed.expect("a flag group's defaults parse")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fruit {
        Apple,
        Pear,
        Plum,
    }

    impl Named for Fruit {
        const ALL: &'static [Self] = &[Fruit::Apple, Fruit::Pear, Fruit::Plum];

        fn name(self) -> &'static str {
            match self {
                Fruit::Apple => "apple",
                Fruit::Pear => "pear",
                Fruit::Plum => "plum",
            }
        }
    }

    #[derive(Debug, clap::Args)]
    struct Knobs {
        #[arg(long)]
        bin: String,
        #[arg(long, default_value_t = 7)]
        count: usize,
    }

    #[test]
    fn defaults_are_the_flags_defaults() {
        let k: Knobs = defaults(&["--bin=x"]);
        assert_eq!((k.bin.as_str(), k.count), ("x", 7));
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn names_lists_and_all_select_in_the_benchmarks_order() {
        for f in Fruit::ALL {
            assert_eq!(parse::<Fruit>(f.name()), Ok(*f));
        }
        let (s, all) = select::<Fruit>(&strings(&["plum,apple"])).unwrap();
        assert_eq!((s, all), (vec![Fruit::Apple, Fruit::Plum], false));
        let (s, all) = select::<Fruit>(&strings(&["pear", "all", "pear"])).unwrap();
        assert_eq!((s, all), (Fruit::ALL.to_vec(), true));
    }

    #[test]
    fn an_unknown_or_missing_name_is_refused_with_the_choices() {
        let e = select::<Fruit>(&strings(&["apple,kiwi"])).unwrap_err();
        assert_eq!(
            e,
            "--scenario \"kiwi\": want one of apple, pear, plum, all (or a comma list)"
        );
        let e = select::<Fruit>(&strings(&[" , "])).unwrap_err();
        assert_eq!(e, "--scenario: no scenario given");
    }
}
