//! Applications nobody chose (issue 43): Loki and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].
