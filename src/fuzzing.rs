//! Hidden helpers shared by the fuzz targets and their corpus-replay tests.
//! Not a public API: enabled only by the `fuzzing` feature.
