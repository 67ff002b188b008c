//! The model's verdicts, as CI checks them: the correct rules hold every property, each
//! weakened rule breaks the property it is about, and counter loss shows its known limit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_model::{Action, FencingModel, Limit, Recovery, Rules, check, limit_counterexample};

fn broken(model: FencingModel) -> Vec<&'static str> {
    let outcome = check(model);
    assert!(outcome.states > 100, "only {} states explored", outcome.states);
    outcome.violated.iter().map(|(name, _)| *name).collect()
}

#[test]
fn the_correct_rules_hold_every_property() {
    assert_eq!(broken(FencingModel::new(2, 4, 0)), Vec::<&str>::new(), "without counter loss");
    assert_eq!(broken(FencingModel::new(2, 4, 1)), Vec::<&str>::new(), "with a counter loss");
    let epoch = |losses| FencingModel::new(2, 4, losses).with_recovery(Recovery::Epoch);
    assert_eq!(broken(epoch(0)), Vec::<&str>::new(), "epoch, without loss");
    assert_eq!(broken(epoch(1)), Vec::<&str>::new(), "epoch, with a loss (of the counter and the epoch)");
}

#[test]
fn each_weakened_rule_is_caught_for_its_reason() {
    let cases = [
        (Rules::EqualFromAnyGrant, "fence order"),
        (Rules::CheckedRepairsOnlyBelow, "checked grant above the watermark"),
        (Rules::RepairWithoutGap, "repair outranks earlier grants"),
    ];
    for (rules, property) in cases {
        let found = broken(FencingModel::new(2, 4, 1).with_rules(rules));
        assert!(found.contains(&property), "{rules:?} broke {found:?}, not `{property}`");
    }
    // An epoch raised only to the watermark's own leaves the grants below it: the repair
    // never ends.
    let found =
        broken(FencingModel::new(2, 4, 1).with_recovery(Recovery::Epoch).with_rules(Rules::EpochNotPastTheWatermark));
    assert!(found.contains(&"repair terminates"), "the epoch at the watermark's broke {found:?}");
}

#[test]
fn counter_loss_shows_the_known_limits() {
    assert_eq!(broken(FencingModel::new(2, 4, 2)), Vec::<&str>::new(), "two losses: the properties that must hold");
    let steps = limit_counterexample(FencingModel::new(2, 4, 1), Limit::StaleAfterNewer).expect("the first limit");
    assert!(steps.iter().any(|a| matches!(a, Action::Lose(..))), "the counterexample needs a loss: {steps:?}");
    let steps = limit_counterexample(FencingModel::new(2, 4, 2), Limit::RepairOutranks).expect("the second limit");
    assert!(steps.iter().filter(|a| matches!(a, Action::Lose(..))).count() == 2, "it needs two losses: {steps:?}");
}

/// The epoch repair has the same limits, no more: two losses keep fence order, checked grants
/// and termination; a grant from before a loss can outrank later ones until it writes; after a
/// second loss before a repaired grant wrote, its fence can be issued again.
#[test]
fn epoch_recovery_has_the_same_limits() {
    let epoch = |losses| FencingModel::new(2, 4, losses).with_recovery(Recovery::Epoch);
    assert_eq!(broken(epoch(2)), Vec::<&str>::new(), "two losses: the properties that must hold");
    assert!(limit_counterexample(epoch(1), Limit::StaleAfterNewer).is_some(), "the first limit");
    let steps = limit_counterexample(epoch(2), Limit::RepairOutranks).expect("the second limit");
    assert!(steps.iter().filter(|a| matches!(a, Action::Lose(..))).count() == 2, "it needs two losses: {steps:?}");
}
