package manifest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/config/crd"
)

// crdValidation is the validation of the SequentialInbox CRD as the API server builds it: the
// structural schema (pruning, defaults), the OpenAPI schema validator and the CEL rules.
type crdValidation struct {
	structural *structuralschema.Structural
	schema     validation.SchemaValidator
	rules      *cel.Validator
}

// loadCRDValidation builds crdValidation from the embedded CRD once; the CEL rules compile in
// milliseconds, and the fuzz test parses many manifests.
var loadCRDValidation = sync.OnceValues(func() (*crdValidation, error) {
	var def apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(crd.SequentialInbox, &def); err != nil {
		return nil, fmt.Errorf("embedded CRD: %w", err)
	}
	for _, v := range def.Spec.Versions {
		if v.Name != v1alpha1.GroupVersion.Version || v.Schema == nil {
			continue
		}
		var props apiextensionsinternal.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &props, nil); err != nil {
			return nil, fmt.Errorf("embedded CRD schema: %w", err)
		}
		structural, err := structuralschema.NewStructural(&props)
		if err != nil {
			return nil, fmt.Errorf("embedded CRD structural schema: %w", err)
		}
		schema, _, err := validation.NewSchemaValidator(&props)
		if err != nil {
			return nil, fmt.Errorf("embedded CRD schema validator: %w", err)
		}
		return &crdValidation{structural: structural, schema: schema, rules: cel.NewValidator(structural, true, celconfig.PerCallLimit)}, nil
	}
	return nil, fmt.Errorf("embedded CRD has no schema for version %s", v1alpha1.GroupVersion.Version)
})

// validateAsTheAPIServer checks one SequentialInbox document as the API server checks a create
// with strict field validation (kubectl's default): no unknown field, then, with the CRD's
// defaults applied, the OpenAPI schema and the CEL rules. It returns every error, each starting
// with its field path.
func validateAsTheAPIServer(ctx context.Context, raw []byte) ([]error, error) {
	v, err := loadCRDValidation()
	if err != nil {
		return nil, err
	}
	data, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(data, &obj); err != nil {
		return nil, err
	}
	var errs []error
	for _, path := range pruning.PruneWithOptions(obj, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, fmt.Errorf("%s: unknown field; docs/reference.md lists the fields of a SequentialInbox", path))
	}
	if meta, _ := obj["metadata"].(map[string]any); meta == nil || meta["name"] == nil {
		return append(errs, field.Required(field.NewPath("metadata", "name"), "a SequentialInbox needs a name")), nil
	}
	defaulting.Default(obj, v.structural)
	fieldErrs := validation.ValidateCustomResource(nil, obj, v.schema)
	ruleErrs, _ := v.rules.Validate(ctx, nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	for _, e := range append(fieldErrs, ruleErrs...) {
		if e.Field == "<nil>" {
			// A rule on the whole object: its message names the fields (metadata.name).
			errs = append(errs, errors.New(e.Detail))
			continue
		}
		errs = append(errs, e)
	}
	return errs, nil
}
