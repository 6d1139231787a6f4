//! Applications nobody chose (issue 43): FLEX and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].
