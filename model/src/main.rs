//! `scripts/model-check`: checks the fencing model with the correct rules (no counterexample
//! allowed) and with each rule weakened (a counterexample required), printing the states
//! explored. Exits 1 when a check does not come out as it must.

use palisade_model::{FencingModel, Limit, Recovery, Rules, check, limit_counterexample};

fn main() {
    let (clients, grants) = (2, 5);
    let mut ok = true;
    let epoch = |losses| FencingModel::new(clients, grants, losses).with_recovery(Recovery::Epoch);
    let runs: [(&str, FencingModel, Option<&str>); 9] = [
        ("correct rules, no counter loss", FencingModel::new(clients, grants, 0), None),
        ("correct rules, one counter loss", FencingModel::new(clients, grants, 1), None),
        (
            "equal fence accepted from any grant",
            FencingModel::new(clients, grants, 1).with_rules(Rules::EqualFromAnyGrant),
            Some("fence order"),
        ),
        (
            "lock_checked repairs only below the watermark (< for <=)",
            FencingModel::new(clients, grants, 1).with_rules(Rules::CheckedRepairsOnlyBelow),
            Some("checked grant above the watermark"),
        ),
        (
            "repair without the gap",
            FencingModel::new(clients, grants, 1).with_rules(Rules::RepairWithoutGap),
            Some("repair outranks earlier grants"),
        ),
        (
            "correct rules, two counter losses (fence order, checked grants, termination)",
            FencingModel::new(clients, 4, 2),
            None,
        ),
        ("epoch recovery, one loss of the counter and the epoch", epoch(1), None),
        (
            "epoch recovery, two losses (fence order, checked grants, termination)",
            FencingModel::new(clients, 4, 2).with_recovery(Recovery::Epoch),
            None,
        ),
        (
            "epoch raised to the watermark's own, not past it",
            epoch(1).with_rules(Rules::EpochNotPastTheWatermark),
            Some("repair terminates"),
        ),
    ];
    for (what, model, must_break) in runs {
        let outcome = check(model);
        let broken: Vec<&str> = outcome.violated.iter().map(|(name, _)| *name).collect();
        let as_it_must = match must_break {
            None => broken.is_empty(),
            Some(property) => broken.contains(&property),
        };
        ok &= as_it_must;
        println!(
            "{} {what}: {} states explored; {}",
            if as_it_must { "ok  " } else { "FAIL" },
            outcome.states,
            if broken.is_empty() {
                "every property holds".to_string()
            } else {
                format!("counterexample to: {}", broken.join(", "))
            }
        );
        for (name, steps) in &outcome.violated {
            println!("       {name}: {steps:?}");
        }
    }
    let limits = [
        (Limit::StaleAfterNewer, FencingModel::new(clients, grants, 1), "one counter loss"),
        (Limit::RepairOutranks, FencingModel::new(clients, 4, 2), "two counter losses"),
        (Limit::RepairOutranks, FencingModel::new(clients, 4, 2).with_recovery(Recovery::Epoch), "two epoch losses"),
    ];
    for (limit, model, with) in limits {
        match limit_counterexample(model, limit) {
            Some(steps) => println!("ok   known limit with {with}, `{}`: {steps:?}", limit.property()),
            None => {
                ok = false;
                println!("FAIL the known limit `{}` was not found with {with}", limit.property());
            }
        }
    }
    if !ok {
        std::process::exit(1);
    }
}
