//! Applications nobody chose (issue 43): PARD and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].
