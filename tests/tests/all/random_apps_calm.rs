//! Applications nobody chose (issue 43): CALM and its baselines on conversation traffic, with the generated
//! applications and helpers of [`super::random_apps`].
